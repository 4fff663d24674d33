// Package policy says what a sandboxed command may touch: it turns an
// executor's manifest and arguments ([Derive]) or a named profile
// ([ForProfile]) into a [Policy], plain data that the sandbox package's
// backends only translate.
//
// It owns the Metnos words for it: capability names, hints and when
// clauses ([Capability], read once into a [Manifest] by [ParseManifest])
// and what each means on a device ([CapabilityTable]), the
// autonomy levels ([Autonomy]), the minimum-sandbox words ([Level],
// [ParseLevel]) and the profiles ([Profile]). It also owns the device
// nucleus ([Nucleus]) and the session IPC endpoints ([SessionIPC]): the
// paths no grant can open, fixed in code.
//
// What it guarantees:
//
//   - Every Policy it returns is normalized ([Policy.Normalize]): grant
//     paths are absolute, canonical (symlinks resolved when it was
//     made) and sorted; every path of the nucleus and the session IPC
//     is a [Mask], whether it exists or not, with a second mask for its
//     target when it resolves elsewhere.
//   - A Policy derived from a manifest never grants a path inside a
//     mask (the agent's own Extra grants marked Own aside), never grants
//     /proc, /sys or /dev, and grants system paths and shared roots
//     read-only.
//   - Every capability in force means what the table says: a grant,
//     nothing, or a refusal ([ErrCapabilityRefused]); one the table does
//     not know (or a hint or when clause it does not know) is refused,
//     never ignored.
//   - Equal policies have equal [Policy.Fingerprint]s.
//
// What it does not do: it enforces nothing and starts no process. It
// reads the file system (to resolve symlinks and find which paths
// exist), so a Policy describes the host at the moment it was made;
// package sandbox opens the grants again, without following links,
// when a run starts. It reads no environment variable and knows none of
// the agent's folders: the caller describes the device in a [Host].
//
// Error messages begin with "sandbox: ", as they did when this code
// lived in package sandbox: they are what the user sees of a refused
// grant.
package policy
