// Package undo keeps this device's own account of what executors changed
// on it, and can put those changes back without the server.
//
// The Metnos server owns the undo log and normally undoes a device's
// changes by sending their reverse as ordinary invocations (protocol
// §6.7); executors keep a backup blob of a file before they destroy it,
// under <user data>/_history/<turn>/blob/. This package adds, on the
// device:
//
//   - a [Journal]: for every invocation whose executor can write, a
//     record when it starts and one when its result is known (the rows
//     that describe changes, the folders it created, the blobs it kept,
//     the reverse patterns its signed manifest declares, the folders it
//     was allowed to write, and the size and modification time of every
//     file it left where it is now). The journal is append-only, fsynced
//     and chained with blake3 (internal/chainlog): an edited or removed
//     record is found. Several processes may append to it (the agent
//     and a local undo).
//   - recognition of the server's reverse invocations: after any
//     writing invocation, the entries whose paths it touched are checked
//     against the disk, and the changes now put back are marked undone.
//   - a local undo ([Journal.Undo]) of one entry, applying its reverse
//     patterns (swap_src_dst, restore_blob_backup, delete_created_paths,
//     delete_created_dirs) newest row first, for when the server is gone.
//   - blob retention and a size quota ([Expire]).
//
// What a local undo guarantees:
//
//   - It never replaces a file. A file to be moved back whose size or
//     modification time differs from what the journal recorded, a place
//     to restore to that is taken by another file, a folder that is not
//     empty: each is reported as a conflict and left as it is, with
//     both files kept.
//   - A backup blob is hashed (SHA-256, the name the shim gave it and
//     the hash the result row recorded) while it is copied, and the
//     copy is put in place only when the hash matches: a corrupted blob
//     is reported, never restored.
//   - It is idempotent: each step looks at the disk before acting and
//     is a single rename, link or rmdir (a move is a hard link then the
//     removal of the old name; a restore is a temporary file, fsynced,
//     linked into place). Killed at any point and run again, it
//     finishes, without losing or duplicating a file.
//   - It acts only inside the folders the original invocation was
//     allowed to write (its sandbox's write grants, symbolic links
//     resolved), and reads blobs only from the agent's own history
//     folder, so a result row cannot make it touch anything else.
//
// What it does not guarantee: the checks and the act are separate
// system calls, so a process changing the same files at the same moment
// can race them (a file written between the size check and the move is
// still moved, not lost); "unchanged" means same size and modification
// time, not same bytes, for moved and created files (blobs are hashed);
// a move across file systems, and patterns other than the four above,
// are reported as not undoable here; and the journal's chain has no
// secret, so it shows tampering but cannot prevent it.
package undo
