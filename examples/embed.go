// Package examples holds the sample executors the demo and the tests run,
// with our own small stdlib-only Python shim (executor_helpers) they
// import, and a generator of small real JPEG photos carrying EXIF dates.
//
// The executors follow the Metnos runner protocol (docs/protocol.md §8): each is
// a directory with a manifest.toml and the Python files its [code].files
// lists; the agent runs `<python> <entry.py>` with PYTHONPATH=<shim
// dir>:<executor dir>, the arguments as one JSON object on stdin, and reads
// one JSON object from stdout. The mutating ones (organize_photos,
// move_files, write_files, create_dirs, delete_files, delete_dirs) keep
// backup blobs and report result rows in the shapes the upstream Metnos
// file executors write and the server's undo translates
// (docs/protocol.md §10.1); move_files, delete_files and delete_dirs
// are what that undo calls back on the device.
//
// The manifests carry digest = "sha256:0": a signer fills in the real
// digest before the server hands them out.
package examples

import (
	"embed"
	"io/fs"
)

//go:embed all:shim all:executors
var files embed.FS

// Shim is the Python shim, rooted at its directory: executor_helpers.py.
var Shim fs.FS = sub("shim")

// Executors holds one directory per executor (echo_args, list_folder,
// organize_photos, move_files, write_files, create_dirs, delete_dirs,
// delete_files), each with its manifest.toml and code.
var Executors fs.FS = sub("executors")

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // cannot happen: dir is a valid, embedded path
	}
	return f
}
