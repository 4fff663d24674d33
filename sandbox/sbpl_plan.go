package sandbox

import (
	"fmt"
	"strings"

	"github.com/metnos/agent/policy"
)

// seatbeltWord is the sandbox word of the macOS backend.
const seatbeltWord = "seatbelt"

// seatbeltWeaker says what a seatbelt run does not apply that the full
// Linux sandbox does. It is the Reason of every seatbelt run.
const seatbeltWeaker = "seatbelt (sandbox-exec) confines files, network and IPC, but macOS has no PID namespace " +
	"and no memory cgroup here: memory is not limited (macOS does not enforce RLIMIT_AS), processes are bounded " +
	"by RLIMIT_NPROC (counted per user), file size by RLIMIT_FSIZE; the deadline kills the process group, and a " +
	"process that leaves the group outlives it"

// seatbeltHostPIDs is why a Policy with HostPIDs (system:read
// processes) is refused on macOS: the profile lets process-info reach
// only the sandbox's own processes, and opening it to the others would
// open their environments too (sysctl KERN_PROCARGS2 returns a process's
// arguments and its environment in one answer), which seatbelt cannot
// split.
const seatbeltHostPIDs = "system:read processes needs the host's process list, and seatbelt cannot show other processes' command lines " +
	"without their environment (macOS returns both in one sysctl, KERN_PROCARGS2); refusing rather than exposing them"

// seatbeltPlan decides how the macOS backend runs p with the agent-wide
// minimum min: with sandbox-exec when have is true and the sandbox is not
// disabled (disabled says by what, or is empty), or refused. It is the
// darwin PlanFor, kept free of build tags so that it is tested everywhere.
//
// Seatbelt gives LevelIsolated: a minimum of LevelFull (namespaces,
// Landlock and seccomp together, as full-fs-no-net asks) is refused, and
// so is a Policy that will not fall back from the layers it is defined
// with. Without sandbox-exec nothing runs: every Policy masks the device
// nucleus and only a sandbox can enforce that. When Options.Disabled turns
// the sandbox off, a Policy runs unconfined ("none") only where Linux
// would too: with the network, without unix sockets beside masks, and
// without a minimum.
func seatbeltPlan(have bool, disabled string, p policy.Policy, min policy.Level) (sandbox, best, reason, refused string) {
	need := p.MinSandbox
	if min > need {
		need = min
	}
	best = "none"
	if have {
		best = seatbeltWord
	}
	switch {
	case disabled != "":
		sandbox, reason = "none", disabled
	case !have:
		return "none", best, "/usr/bin/sandbox-exec is missing",
			"/usr/bin/sandbox-exec is missing, and nothing else on macOS can confine the command to its policy (the device nucleus, the network cut)"
	default:
		sandbox, reason = seatbeltWord, seatbeltWeaker
	}
	switch {
	case p.HostPIDs:
		refused = seatbeltHostPIDs
	case p.NoFallback:
		refused = fmt.Sprintf("profile %s needs Linux namespaces (bubblewrap) and will not fall back to %s", p.Profile, sandbox)
	case need > policy.LevelIsolated:
		refused = fmt.Sprintf("minimum sandbox %q needs namespaces, Landlock and seccomp together (Linux); macOS gives %s at most", need, best)
	case sandbox == "none" && !p.Network:
		refused = "the policy cuts the network, and with the sandbox off nothing can enforce the cut: " + reason
	case sandbox == "none" && p.UnixSockets && len(p.Masks) > 0:
		refused = "the policy allows unix sockets, and with the sandbox off nothing keeps the masked session sockets out of reach: " + reason
	case sandbox == "none" && need > policy.LevelNone:
		refused = fmt.Sprintf("minimum sandbox %q not met: %s", need, reason)
	}
	return sandbox, best, strings.TrimSpace(reason), refused
}
