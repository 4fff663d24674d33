package shim

import (
	"encoding/json"
	"fmt"
	"os"
)

// LayerArg is the hidden first argument that turns a binary into the
// layer stage of a dry run (Linux):
// <binary> LayerArg <LayerSpec JSON> -- <bwrap> [args...].
//
// The agent starts the stage in a user and a mount namespace of its own
// (the user namespace maps the agent's uid and gid to themselves, or
// every id to itself for root, and the stage is given CAP_SYS_ADMIN
// there, with the capabilities over files an overlay needs of its
// mounter, as ambient capabilities). In
// that mount namespace, and in no other, the stage mounts an overlay on
// each folder of [LayerSpec.Layers], whose upper layer takes every
// write; then it gives up its capabilities and executes bubblewrap,
// whose own namespaces are made from that mount namespace, so that
// every bind of the sandbox beneath those folders shows the overlay.
// What the command writes there lands in the upper layers, never in
// the folders themselves. When a step fails, it reports a [Status]
// with Layer and Error set on [StatusFD] and exits with
// [ExitShimFailed]: bubblewrap, and so the command, never starts.
const LayerArg = "__metnos-layer"

// LayerBwrap is the argv[0] the layer stage gives bubblewrap: it names
// a dry run's bubblewrap, whose outer process lives in the stage's user
// namespace rather than in the agent's, for the sweep of processes that
// runs left half set up (sandbox.SweepOrphans), which must tell it from
// the inner process of an ordinary run.
const LayerBwrap = "metnos-layer-bwrap"

// LayerSpec is what the layer stage does before it becomes bubblewrap.
type LayerSpec struct {
	// HostMountNS is the inode of the agent's own mount namespace: the
	// stage refuses to mount anything when it finds itself in it.
	HostMountNS uint64 `json:"host_mnt_ns"`
	// Layers are the overlays to mount, on folders that do not lie in
	// one another.
	Layers []Overlay `json:"layers"`
	// Mkdirs are folders to make, with their parents, once the layers
	// are mounted (the folders above the placeholders of masked paths,
	// which bubblewrap needs to exist): they land in the upper layers.
	Mkdirs []string `json:"mkdirs,omitempty"`
	// Reopen are descriptors the stage replaces, once the layers are
	// mounted, by the path opened again (without following any
	// symbolic link): the grants bubblewrap binds by descriptor, so
	// that it binds what this mount namespace shows there.
	Reopen []Reopen `json:"reopen,omitempty"`
	// FSType is the file system to mount: "" for "overlay". Tests name
	// one the kernel does not have, to see a dry run refused.
	FSType string `json:"fstype,omitempty"`
}

// Overlay is one folder put behind an overlay.
type Overlay struct {
	// Path is the folder, canonical: the overlay's lower layer and its
	// mount point.
	Path string `json:"path"`
	// Dev and Ino are the folder the agent found at Path: the stage
	// refuses to mount on anything else.
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
	// Upper and Work are the overlay's upper and work folders (empty,
	// canonical, the agent's, on one file system).
	Upper string `json:"upper"`
	Work  string `json:"work"`
}

// Reopen is one descriptor to replace (see LayerSpec.Reopen).
type Reopen struct {
	FD   int    `json:"fd"`
	Path string `json:"path"`
}

// EncodeLayerArgs returns the argv, after the binary itself, that runs
// the layer stage with spec and then bwrapArgv (bubblewrap and its
// arguments).
func EncodeLayerArgs(spec LayerSpec, bwrapArgv []string) ([]string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("shim: encoding the layer spec: %w", err)
	}
	return append([]string{LayerArg, string(b), "--"}, bwrapArgv...), nil
}

// MainLayer runs the layer stage on args (spec JSON, "--", bwrap...)
// and returns an exit status only when it fails; on success it does not
// return.
func MainLayer(args []string) int {
	status := os.NewFile(StatusFD, "shim-status")
	if len(args) < 3 || args[1] != "--" {
		return failLayer(status, fmt.Errorf("usage: %s SPEC -- BWRAP [ARG...]", LayerArg))
	}
	var spec LayerSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		return failLayer(status, fmt.Errorf("decoding the layer spec: %w", err))
	}
	return layer(status, spec, args[2:])
}

// failLayer reports a failure of the layer stage.
func failLayer(status *os.File, err error) int {
	report(status, Status{Error: err.Error(), Layer: true})
	fmt.Fprintf(os.Stderr, "metnos-shim: dry run layer: %v\n", err)
	return ExitShimFailed
}
