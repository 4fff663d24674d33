package sandbox

import (
	"net"
	"net/netip"
)

// Options are what the caller tells the sandbox about this machine and
// its own configuration: which bubblewrap and shim to use, where the
// placeholder locks go, and whether the sandbox is turned off. The
// package reads no environment variable and knows none of the caller's
// folders: the agent reads its configuration once and passes it in
// here. The zero Options use the defaults written on each field.
type Options struct {
	// Disabled, when not "", turns every layer off and says why (it
	// becomes Caps.Disabled and the reason of every run): the command
	// then runs unconfined. For tests and debugging only.
	Disabled string
	// Bwrap is the bubblewrap binary to use on Linux, wherever it is
	// (made absolute). "": the first bwrap in a trusted system folder of
	// SearchPath that is owned by root and writable by nobody else.
	Bwrap string
	// SearchPath is the PATH list bwrap is looked for in when Bwrap is
	// "" (Linux): normally the caller's own PATH. "": the trusted system
	// folders themselves, in their order.
	SearchPath string
	// Shim is the shim binary on Linux. "": this executable, which must
	// then call shim.MainIfShim first thing in main.
	Shim string
	// LockDir is the folder of the Linux placeholder locks: one per
	// user, the same for every run of that user in any process, so every
	// caller on a machine must pass the same. It is created (0700) if
	// missing and must be a private folder of this user. "": a folder
	// named after this uid in the temporary folder.
	LockDir string
	// DryRunScratch is the folder where a dry run (Request.DryRun, Linux)
	// keeps its layers' upper and work folders while it runs, in a
	// private folder of its own removed afterwards. It must be on a file
	// system that keeps user extended attributes (ext4, xfs, btrfs;
	// tmpfs since Linux 6.6), and outside every folder a run may write
	// (a dry run that would layer it is refused). "": the temporary
	// folder.
	DryRunScratch string
	// EgressResolver resolves the names a run's egress proxy connects
	// to. nil: the system's resolver. Tests point it at a DNS server of
	// their own.
	EgressResolver *net.Resolver
	// EgressStandIns are addresses of this machine the egress proxy
	// takes for public hosts all the same, where a run's wildcard hint
	// would otherwise never reach them (this device's own network): for
	// tests that stand a public server up on a documentation address of
	// a network namespace of their own. Nil for every real run.
	EgressStandIns []netip.Prefix
	// StrictEgress refuses a run whose network is narrowed to named
	// hosts where the sandbox cannot keep the command from going around
	// the proxy (Windows' job object), instead of running it with the
	// narrowing binding only the programs that use the proxy variables.
	StrictEgress bool
	// Priority is how much of the machine runs may take from the
	// owner's programs (the owner's file); the zero Priority is
	// [DefaultPriority].
	Priority Priority
	// NoAppContainer, when not "", keeps Windows runs out of the
	// AppContainer and says why (the owner's
	// METNOS_SANDBOX_APPCONTAINER=0): they take the next rung down.
	NoAppContainer string
	// ContainerName is the AppContainer profile of this device's runs on
	// Windows. "": Metnos.Agent.Executor.
	ContainerName string
	// GrantLedger is the folder where Windows runs record the access
	// entries they add for the AppContainer before adding them, for the
	// next start to remove what a killed run left: a folder of the
	// caller's that lasts (the agent's data folder). "": a folder in the
	// temporary folder, named after the container.
	GrantLedger string
	// dryRunFS is the file system a dry run's layer stage mounts ("":
	// overlay): tests name one the kernel lacks, to see a dry run
	// refused by the kernel's failure itself.
	dryRunFS string
	// jobOnly keeps Windows runs on the job-object rung whatever else the
	// machine gives: for the tests of that rung.
	jobOnly bool
}
