// Package undo keeps this device's own account of what executors changed
// on it, and can put those changes back without the server.
//
// The Metnos server owns the undo log and normally undoes a device's
// changes by sending their reverse as ordinary invocations (docs/protocol.md
// §10.1); executors keep a backup blob of a file before they destroy it,
// under <user data>/_history/<turn>/blob/. This package adds, on the
// device:
//
//   - a [Journal]: for every invocation whose executor can write, a
//     record when it starts and one when its result is known (the rows
//     that describe changes, the folders it created, the blobs it kept,
//     the reverse patterns its signed manifest declares, the folders it
//     was allowed to write and the paths masked in them, and the size
//     and modification time of every
//     file it left where it is now, inside its grants). The journal is append-only, fsynced
//     and chained with blake3 (internal/chainlog): an edited or removed
//     record is found. Several processes may append to it (the agent
//     and a local undo). It is written in segments of [segmentBytes]
//     (journal.jsonl, journal_000002.jsonl...), the chain running across
//     them; what is the same for every run of a sandbox policy (its
//     ~50 masked paths, the blob folder) is written whole once per
//     segment and named by its hash in the other begin records. Only the
//     entries still running and the newest ones ([window]) are kept in
//     memory; opening the journal reads back only to the last record
//     saying no run was open, and older entries are read from the disk,
//     newest first, when asked for (history, a local undo of an old
//     change). Old segments are pruned whole after a retention
//     ([Journal.Prune]); START records where the chain then starts.
//   - recognition of the server's reverse invocations: after any
//     writing invocation, the entries whose paths it touched, among the
//     newest [window] ones and those running, are checked against the
//     disk, and the changes now put back are marked undone. An older
//     change put back is not marked: a local undo of it finds each step
//     already done, and says so.
//   - a local undo ([Journal.Undo]) of one entry, applying its reverse
//     patterns (swap_src_dst, restore_blob_backup, delete_created_paths,
//     delete_created_dirs) newest row first, for when the server is gone,
//     by the rules the server applies to the rows the upstream file
//     executors write (metnos-protocol §6.7.1): a blob is blob_path,
//     else prev_blob_path, else the file named by blob_sha256 or
//     prev_blob_sha256 under the history folder (a row naming a blob
//     that is gone is a failure; a row naming none is not
//     restore_blob_backup's); a created row is removed by what it is on
//     the disk (a folder only when empty); a skipped row is no change.
//     A created file or folder counts as undone by a later invocation
//     only if that one deleted it (a move of it is not its undo).
//   - an undo that leaves any step undone (a conflict, a pattern it
//     cannot do) says so, and its entry is not marked undone; --last
//     passes over entries a local undo left in conflict. A change whose
//     journal records are at or after a place where the chain fails
//     (an edit, a removal, a tail that is not a crash's) is refused.
//   - blob retention and a size quota ([Expire]).
//
// What a local undo guarantees:
//
//   - It never replaces a file, but the one an executor overwrote (a
//     write_files overwrite) while it is still what the run left: same
//     size, modification time and SHA-256 as the journal recorded after
//     the run. One changed since is kept, the version from before the
//     run put beside it ("notes (before the change).txt"), and a
//     conflict reported. So is one whose state after the run was not
//     hashed (the journal hashes at most 1 GiB per run, each path once,
//     and only inside the run's grants), and one of an entry recorded
//     only at a start after a crash (from the spooled result, looked at
//     late: a user's edit in between would pass for the run's); a file
//     such an entry created is kept. A file to be moved back whose size or
//     modification time differs from what the journal recorded, a place
//     to restore to that is taken by another file, a folder that is not
//     empty: each is reported as a conflict and left as it is, with
//     both files kept. On Linux and macOS a move is one rename that the
//     kernel refuses when the target exists (renameat2 RENAME_NOREPLACE,
//     renameatx_np RENAME_EXCL); where a file system cannot do that, a
//     file is hard-linked then unlinked, and a folder is not moved.
//   - A backup blob is opened once, from the history folder down with
//     no symbolic link in any component (a history folder that is
//     itself a link is refused: it lies in a folder executors can
//     write), hashed whole (SHA-256, the name the shim gave it and the
//     hash the result row recorded) before any byte of it is copied,
//     and hashed again while that same open file is copied; the copy is
//     renamed into place only when the hash matches: a corrupted blob
//     is reported, never restored. A blob that is not a regular file (a
//     link, a FIFO) is refused without being opened for long. A row's
//     blob_path outside the history folder is not used; the blob named
//     by its SHA-256 in the history folder is, as the server does.
//   - It is idempotent: each step looks at the disk before acting and
//     is a single rename or removal. Killed at any point and run again,
//     it finishes, without losing or duplicating a file: a move cut
//     between its hard link and its unlink is finished by dropping the
//     old name, and a restore's temporary file (a short name of the
//     undo's own, beside its target) is removed by the next run.
//   - It acts only on clean absolute paths (no "..": the kernel would
//     read a link followed by ".." otherwise than a check on the text
//     does) strictly inside the folders the original invocation was
//     allowed to write (its sandbox's write grants, links resolved; a
//     granted folder itself is never moved or removed, which the run
//     could not do either; a granted single file is acted on by its one
//     name), never on, under or holding a path its sandbox masked
//     (~/.ssh, the keyrings, the agent's own data...; without case on
//     macOS and Windows). Every step goes through the grant's folder
//     opened as an os.Root, and on Linux, after the folder is opened,
//     the kernel is asked where it really is (by its descriptor) and
//     the step acts by *at system calls on one name in it: a link
//     swapped in after the checks, or made by an earlier step of the
//     same undo, cannot lead it out. It reads blobs only from the
//     agent's own history folder.
//
// What it does not guarantee: "unchanged" means same size and
// modification time, not same bytes, for moved and created files
// (blobs are hashed); a process writing a file between that check and
// the move has its file moved, not lost; on macOS the folder's real
// place is its path resolved again just before each step, and on
// Windows the steps use full paths (checked, then acted on), so there a
// link swapped in between by a process running at that moment is not
// caught; a move across file
// systems, and patterns other than the four above, are reported as not
// undoable here (restore_trashed_files, which names Google Drive ids,
// has nothing to do on the device's files); and the journal's chain has
// no secret, so it shows tampering but cannot prevent it.
package undo
