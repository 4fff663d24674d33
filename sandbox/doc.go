// Package sandbox runs a command confined to a [policy.Policy], in the
// strongest sandbox the operating system offers, and says honestly which
// one that was.
//
// There is one entry point, [Run]. A Policy is plain data derived in one
// portable place, package policy ([policy.Derive] from an executor's
// manifest and arguments, [policy.ForProfile] for the named profiles);
// the backends here only translate it.
//
// # What Run guarantees on Linux
//
// With every layer ("bwrap+landlock+seccomp"):
//
//   - The command sees a mount view built by bubblewrap: the system
//     directories read-only, a private /proc, /dev and /tmp (and so
//     /dev/shm), and only the granted paths, read-only or writable as
//     granted. Every path of the device nucleus ([policy.Nucleus]: SSH and GPG
//     keys, cloud and cluster credentials, password stores, browser
//     profiles, the agent's own key and state, /etc/shadow...) and every
//     session IPC endpoint ([policy.SessionIPC]) that would be visible is covered
//     by an empty read-only mount, whether or not it exists; an absent one
//     under a writable grant is masked by a placeholder that bwrap creates
//     and Run removes afterwards, so it cannot be created either.
//   - It runs in new user, PID, IPC, UTS and cgroup namespaces and, unless
//     the Policy allows the network, a new network namespace with only a
//     loopback of its own. bwrap drops every capability, also when the
//     agent runs as root.
//   - Inside, the shim (package shim) sets no_new_privs, checks that no
//     capability is left, and applies Landlock (file rules mirroring the
//     mounts; without network, TCP bind and connect denied; abstract unix
//     sockets and signals scoped to the sandbox) and a seccomp filter that
//     denies ptrace and process_vm_*, module and kexec calls, mounts and
//     namespaces (including clone with namespace flags), bpf, userfaultfd,
//     perf_event_open, the keyrings, io_uring, handle-based opens,
//     terminal injection, syscalls of a foreign ABI, and every socket
//     family the Policy does not allow (AF_UNIX is denied unless the
//     Policy asks for it; socketpair stays allowed).
//   - The deadline kills the whole tree: the PID namespace dies with
//     bwrap. When the command exits, whatever it left running dies too.
//   - The process count and the memory of the whole tree are bounded by
//     a cgroup made for the run (pids.max and the memory limit) where the
//     agent may create one: a delegated cgroup v2, or the v1 pids and
//     memory hierarchies when it runs as root. The kernel's OOM counter
//     of that cgroup, with the command's main process killed by SIGKILL,
//     is what sets Output.OOMKilled: a child the limit killed while the
//     command went on leaves the command's own result. Elsewhere rlimits
//     bound them (RLIMIT_NPROC, exact inside the user namespace;
//     RLIMIT_AS per process). File size and core dumps always use
//     rlimits. Output.LimitsBy says which.
//
// A Policy with Egress (the network narrowed to the hosts a manifest
// names) keeps the empty network namespace: the shim listens on
// 127.0.0.1:[ProxyPort] in it and hands the listener to the agent before
// it restricts itself, and the agent's proxy (package sandbox/egress)
// serves it, so nothing of the proxy runs inside. Landlock lets the
// command connect to that port alone and bind nothing; seccomp lets it
// open TCP sockets only. The command gets the usual proxy variables. A
// command that ignores them connects nowhere. Without bwrap such a run
// is refused: in the host's network namespace Landlock's port rule would
// reach any address on the proxy's port. Output.Network lists what the
// proxy allowed and refused.
//
// Two kinds of grant bend that picture, both for the agent's own needs:
//
//   - A grant marked Own (set only by the agent, for the executor's code,
//     the shim and the executor's user data folder) opens through the
//     mask of the agent's own directories: the mask stays, and only that
//     folder shows through it, mounted over it.
//   - A writable directory that an argument names itself is Removable.
//     Where Landlock (ABI 3 or later, which confines truncate) and seccomp
//     apply, and the parent is not a system path, a shared root (/home,
//     /srv, /var, a sticky world-writable directory such as /var/tmp...),
//     in the private /tmp or /dev, granted itself, beside another grant
//     or directly holding a masked path (without bwrap: any masked path
//     or read-only grant beneath it), the parent is mounted in its stead and Landlock gives
//     it nothing but the removal of empty directories, so that the
//     command can remove the directory (a mount point cannot be removed:
//     docs/protocol.md §12.6). seccomp then refuses mode, owner, time and xattr
//     changes by path for the whole run, as without bwrap. The parent's
//     other entries can be stat-ed by name, their links read (readlink),
//     their extended attributes read, and the parent watched with inotify
//     (Landlock confines none of these), not read, listed, written,
//     truncated, renamed or changed. Elsewhere the directory stays a mount point, and removing
//     it fails. Writable grants whose innermost enclosing grant is
//     writable are not mounted again, for the same reason.
//
// Write rules carry Landlock's refer right: files move and link between
// directories beneath writable grants, and the kernel refuses any such
// move that would give a file rights it did not have.
//
// Without a usable bwrap (missing, or user namespaces refused) Run falls
// back to the shim alone ("landlock+seccomp"): Landlock is then the only
// file boundary, so every rule whose directory holds a masked path or a
// read-only grant is split into rules for its entries (the directory
// itself can then be neither listed nor written directly), /tmp is a
// fresh private directory, a supervising shim, a child subreaper, kills
// every descendant at the end, and seccomp also refuses to change modes,
// owners, times and extended attributes by path, which Landlock cannot
// confine (so copying a file with its metadata fails there). With neither Landlock nor seccomp
// the word is "none"; a Policy that cuts the network, a profile that
// forbids fallback (full-fs-no-net) or a minimum the machine cannot meet
// makes Run refuse with a [*RefusedError] rather than run weaker.
//
// A Policy with HostPIDs (system:read processes or health) runs without a
// PID namespace of its own: bwrap binds the host's /proc, so the command
// lists every process with its command line, owner and status, and (as
// with every /proc reader) the host network namespace's /proc/<pid>/net
// tables. It runs only where Landlock scopes signals (ABI 6, Linux 6.12)
// and seccomp filters, with or without bwrap, and is refused otherwise
// with what is missing (the shim checks it again): the user namespace and
// Landlock's ptrace check keep other processes' environment, memory,
// maps, descriptors, working directory and root unreadable; Landlock's
// signal scope refuses every signal to a process outside the run
// (kill, tgkill, sigqueue, pidfd_send_signal, SIGIO); seccomp refuses
// ptrace, process_vm_*, pidfd_open, pidfd_getfd, kcmp and the NUMA page
// moves; a supervising shim kills the tree. Output.Reason says the run
// shares the host's PID namespace. macOS refuses such a Policy (seatbelt
// cannot show a command line without the environment); on Windows every
// run sees every process, and Output.Reason says so.
//
// Nothing of a run outlives Run: the process calling it becomes a child
// subreaper at its first run, and bwrap's child (the sandbox's pid 1,
// which bwrap's outer process does not wait for) is reaped, or killed and
// reaped, before Run returns. A command that has exited by itself when
// its deadline comes due with its end (after a pause of the calling
// process) has not timed out.
//
// # Dry runs (Request.DryRun)
//
// A dry run runs the command with every folder it may write behind a
// copy-on-write layer that is thrown away, and lists in Output.DryRun
// what it changed there. On Linux with bubblewrap only; it is planned
// as any run, and then:
//
//   - Each writable grant the bwrap view binds (a writable file's
//     folder for a file; a removable grant's parent where it is mounted
//     in its stead; the agent's own writable folders too), but those
//     inside another, gets an overlay. Its upper and work folders are
//     made in a private folder in Options.DryRunScratch (else the
//     temporary folder), the upper one with the mode (and for root the
//     owner) of the folder it stands for.
//   - The launch starts the layer stage (package shim, [shim.LayerArg])
//     in a user and a mount namespace of its own, the agent's uid and
//     gid mapped to themselves (for root, every id to itself), with
//     CAP_SYS_ADMIN and the capabilities over files an overlay needs of
//     its mounter as ambient capabilities; in a namespace that maps one
//     uid they bear on that uid's files alone. The stage checks that it
//     is not in the agent's own mount namespace, makes it private,
//     mounts each overlay (the
//     folder, opened without following links and checked to be the one
//     planned, as its lower layer and its mount point; every layer
//     handed to the kernel as a descriptor; the userxattr option), makes
//     the folders above the masks' placeholders beneath the layers,
//     opens again there the grants bubblewrap binds by descriptor,
//     drops the ambient capabilities and executes bubblewrap. The
//     sandbox is then the one described above, made from that mount
//     namespace: every bind beneath those folders shows the overlay.
//     The command gets METNOS_DRY_RUN=1.
//   - When the run's whole tree is gone, package changes reads the upper
//     layers (whiteouts, opaque folders, renames paired by content, hard
//     links; see its doc), the changes beneath the agent's own grants
//     and the placeholders are left out, and the scratch folder is
//     removed.
//
// What a dry run guarantees: nothing beneath the layered folders
// changes, neither content, mode, size, nor modification and change
// times, nor the access times of files of the agent's user (the layer
// and package changes read them with O_NOATIME); and since the layered
// folders are all a run may write but its private /tmp and /dev, nothing
// of the host is written. A dry run that cannot be layered is refused
// with a [*RefusedError] whose DryRun is set, and nothing starts: off
// Linux, with the sandbox off, without bubblewrap (also when bubblewrap
// fails at run time and Run would fall back), for a Policy whose root
// is writable, a writable grant whose folder would be "/", a scratch
// folder inside a layered folder or writable in the view, a placeholder
// outside every layer, and when the kernel will not mount the overlay
// (the stage reports what it said; bubblewrap never starts).
//
// What it does not guarantee: the network is the run's as in any run,
// and what it sends is sent. The list is what a real run changes only
// as far as the overlay behaves as the folders would: a folder of the
// lower layer cannot be renamed (EXDEV; programs that copy and delete
// instead show the move); a file written through one of its hard links
// keeps its old bytes under its other names during the run; an agent
// that is not root cannot write another user's file through the layer
// (its namespace maps no other user: EOVERFLOW).
// Timestamps, owners and extended attributes are not compared. Access
// times of other users' files the run reads follow the mount's relatime
// rule. The upper layers hold what the run writes, in the scratch
// folder, until it ends.
//
// # What Run guarantees on Windows
//
// The strongest of three rungs the machine gives, each proven before it
// is used ([Probe] starts a process suspended in it and reads its token),
// and each run's process checked by its token before it is resumed: a
// process that does not run as planned is killed before its first
// instruction and the run refused, never run weaker in silence. Every
// rung runs the tree in a kill-on-close Job Object (per-process memory,
// 8 processes, no breakaway; the deadline, a cancelled context or the
// agent's death kills the whole tree), in a fresh scratch folder
// (working directory unless Request.Dir is set, TEMP and TMP, removed
// afterwards), with exactly Request.Env plus TEMP and TMP (and SystemRoot
// where it lacks one, LOCALAPPDATA in an AppContainer).
//
//   - "appcontainer": the tree runs in this device's AppContainer
//     (Options.ContainerName, created once). It reaches only what the
//     Policy grants, by access-control entries for the container's SID
//     (read and execute, or modify, inherited below a folder), added for
//     the run and removed after it, and recorded durably before they are
//     added (the grant ledger, Options.GrantLedger) so that the next
//     start removes what a killed run left; an entry that was there
//     before is kept, one two runs need is shared. The nucleus under a
//     grant gets an explicit deny entry; a nucleus path that does not
//     exist under a write grant cannot be denied and the reason names it.
//     System folders are readable as for every AppContainer. The network
//     is cut (no capability) unless the Policy opens it (internetClient:
//     the internet, never loopback or the local network); a Policy that
//     narrows it to named hosts gets internetClient too, as an
//     AppContainer cannot reach the egress proxy, and the reason says the
//     host list is not held. Its level is "isolated".
//   - "job-object+low-integrity": the tree runs with a restricted token
//     at low integrity: it cannot write what this user's programs write
//     (files of medium integrity; the scratch folder is labelled low),
//     but it can read what this user can, the nucleus included, and the
//     network is not isolated. The readonly profile takes this rung.
//     Its level is "contained".
//   - "job-object": the tree is contained and limited; files and
//     network are not isolated, and a command running as this user can
//     start processes outside its job. The full profiles take this rung.
//
// A minimum above the rung is refused before anything starts, with the
// reason the stronger rungs are missing (Caps.AppContainerNote,
// Caps.LowIntegrityNote). Options.NoAppContainer (the owner's
// METNOS_SANDBOX_APPCONTAINER=0) skips the AppContainer. Wine implements
// neither AppContainers nor integrity levels: its tests (.ci/wine) prove
// the job object and the honest fallback, not isolation. See
// run_windows.go and winplan.go.
//
// # What Run guarantees on macOS
//
// "seatbelt": /usr/bin/sandbox-exec with an SBPL profile generated from the
// Policy (deny by default; every path a -D parameter, never profile text;
// masks denied after every allow, as the last matching rule wins). There
// is no PID namespace or memory cgroup: memory is not limited, processes
// and file size are limited by rlimits. A Linux-only minimum ("full") is
// refused, and without sandbox-exec nothing that asks for isolation runs.
// The profile is golden-tested on every system; it has not been run on a
// Mac.
//
// # Priority
//
// Every run gets Options.Priority ([Priority]; the zero value is cpu low,
// io low): set by the shim on the thread that executes the command,
// before the command's first instruction, and inherited by everything it
// starts (nice, SCHED_IDLE, the I/O class; RLIMIT_NICE 0 and no
// capability keep the command from undoing the nice value), with the
// run's cgroup weighted where the agent may make one with the CPU or I/O
// controller, and the run's session autogroup niced where the kernel
// schedules sessions as groups and no cgroup holds the run. RLIMIT_CPU
// bounds each process's processor time ([Output].CPUTimeExceeded). On
// Windows the job carries a priority class, a CPU weight and the whole
// run's user time; on macOS nice and taskpolicy run before sandbox-exec.
// [Output].Priority names what took and what did not; nothing of the
// agent's own process or of any process outside the run is changed. It
// is a share, not a cap: an idle machine is the run's. docs/sandbox.md
// says what each system gives and what is not guaranteed.
//
// # What it does not guarantee
//
//   - Landlock ABI 7 is what the shim is written against; an older kernel
//     gives what it has (no TCP rules below 4, no scoping below 6) and
//     [Probe] says so. Landlock does not restrict connect(2) to pathname
//     unix sockets before ABI 9: the seccomp ban on AF_UNIX sockets is what
//     keeps the command off host sockets, and a Policy with UnixSockets
//     set relies on the masks alone.
//   - Empty directories anywhere beneath the parent of a Removable grant
//     can be removed (Landlock's right holds for the whole tree; masks and
//     other grants are mount points, which cannot be).
//   - A hard link that the host itself made from inside a grant to a
//     secret file is the same file: masks work by path.
//   - Grants are resolved when the Policy is made and opened again,
//     without following any symbolic link, when the run starts: bwrap
//     binds those descriptors, and the shim gives Landlock descriptors
//     too, so a grant swapped for a link in between is refused or gets
//     no rule. Masks and their pinned parents are still mounted by path:
//     another process of the user's that swaps a directory above a mask
//     for a link at that very moment could move the mask. The agent runs
//     one invocation at a time, and a run's whole tree is dead before the
//     next starts, so no executor can be that process.
//   - A home-wide write grant is a home-wide write grant: shell start-up
//     files, ~/.config/autostart, ~/.config/systemd/user, ~/.local/bin
//     and Python's user site-packages are not in the nucleus, and what
//     an executor writes there runs later, outside the sandbox.
//   - Without a cgroup, RLIMIT_AS bounds each process's address space,
//     not the tree's total, OOMKilled stays false, and RLIMIT_NPROC does
//     not bind root at all: a root agent without cgroups has no process
//     limit, and LimitsBy says "rlimit".
//   - Inside bwrap a command that exits with status 128+n is reported as
//     killed by signal n, as shells do.
//   - The session IPC masks hide the user's session bus; rootful daemons'
//     sockets elsewhere (the system bus, docker.sock) are reachable only
//     when the Policy grants their directory and allows AF_UNIX.
//   - An agent running as root runs executors as root (in a user
//     namespace, without capabilities): the files of a granted
//     directory are theirs to change whoever owns them. Set-user-ID and
//     set-group-ID modes are refused by seccomp; a Policy derived from a
//     manifest never grants /proc, /sys or /dev, and system directories
//     only read-only.
//
// # What the agent's process adds to every run
//
// When a tailnet is configured, the agent denies itself listen(2) with a
// seccomp filter (tailnet.DenyListen, applied once in the command line's
// connect step) before it starts any command. That filter, and the
// no_new_privs bit it needs, are process-wide, irreversible and
// inherited: every command Run starts from that process, whatever the
// sandbox level (none included), has listen(2) failing with EPERM and
// no_new_privs set. Without a tailnet neither is applied, and a Run from
// any other program gets only what its Policy asks for.
package sandbox
