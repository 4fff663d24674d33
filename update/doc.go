// Package update keeps metnos-agent current from the server it is
// paired with, the way the Rust client does (docs/protocol.md §9.1),
// without ever leaving the device without a working binary.
//
// # The cycle
//
//  1. [Updater.Check] asks GET /agent/component/metnos-agent/update/<target>
//     for a descriptor signed by the pinned server key, of this
//     component and this build's target, whose version is strictly newer
//     than the one this device last applied and whose sha256 is not the
//     running executable's.
//  2. [Updater.Apply] downloads the build with package fetch (resumable
//     Range chunks, kept only if it hashes to the descriptor's sha256)
//     to <exe>.new beside the running executable, runs it once
//     (`version`) to see that it starts on this machine, writes the
//     probation marker, then swaps: on Linux and macOS the running
//     file is hard-linked to <exe>.old and <exe>.new is renamed over
//     <exe>, so the path never stands empty; on Windows, where a running
//     executable can be renamed but not replaced, <exe> is renamed to
//     <exe>.old and <exe>.new to <exe>. The agent then exits 0 and its
//     supervisor starts the new build.
//  3. [Boot], the first thing `run` does, counts the starts of a build
//     on probation. [Updater.Confirm], after its first successful poll,
//     ends the probation and deletes <exe>.old. A build that has not
//     confirmed after [MaxBoots] starts is rolled back at the next one:
//     it is kept as <exe>.failed, <exe>.old goes back in place, and the
//     failure is logged and reported in the heartbeat.
//
// # What is guaranteed
//
//   - A kill at any point leaves, at the next start, an executable at
//     <exe> that is the old build or the verified new one (on Windows,
//     between its two renames, <exe>.old alone: [Boot], and the logon
//     task before it, put it back).
//   - Nothing that misses the descriptor's sha256 is ever put in place,
//     and a descriptor that does not verify downloads nothing.
//   - A replayed descriptor of an older or equal version is refused once
//     this device has applied one, or once the run loop has found the
//     running executable to be the build of a signed descriptor (a device
//     installed with the server's current build). Before either, the
//     first update accepts any version the server signs for this target
//     (there is nothing to compare a mirror version with).
//   - A version that was rolled back is not applied again by the run
//     loop; a newer one is, and `metnos-agent update` can force it.
//
// # What is not
//
//   - A build that crashes before its main function runs cannot count
//     its own starts; builds are the server's signed releases, and a Go
//     program that starts at all reaches [Boot] within milliseconds.
//   - The signature covers the sha256, not where the build was served
//     from: the url_path only has to stay under /agent/client/.
package update
