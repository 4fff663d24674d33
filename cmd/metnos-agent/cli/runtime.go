package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path"
	"syscall"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/pairing"
)

func runRuntime(std stdio, args []string) int {
	if len(args) == 0 {
		return usageError(std.err, "runtime", "install or status?")
	}
	switch args[0] {
	case "install":
		return runRuntimeInstall(std, args[1:])
	case "status":
		return runRuntimeStatus(std, args[1:])
	case "-h", "-help", "--help":
		return runRuntimeInstall(std, args[:1])
	}
	return usageError(std.err, "runtime", "unknown subcommand %q (install or status)", args[0])
}

func runRuntimeInstall(std stdio, args []string) int {
	fs := newFlagSet("runtime", std, "Install a standalone Python (python-build-standalone) for executors: from a URL or a local archive FILE with a pinned sha256, or from the paired server's signed runtime descriptor (--from-server NAME). The previous runtime stays until the new one has run. \"runtime status\" shows the installed runtime and the Python executors run with.")
	url := fs.String("url", "", "where the archive is: an http(s):// `URL`, or a local file (a path or file://)")
	sha := fs.String("sha256", "", "its pinned SHA-256 (64 `HEX` digits)")
	size := fs.Int64("size", 0, "its pinned size in bytes, `N` (0: unknown)")
	from := fs.String("from-server", "", "an archive `NAME` the paired server signs a descriptor for (cpython-…-install_only.tar.gz)")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	if err := pairing.CheckHome(e.lay); err != nil { // never create a missing home
		return fail(std, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var src fetch.Source
	switch {
	case *from != "" && *url == "" && *sha == "":
		log := progressOptions(std, *from).Logger
		c, node, err := connect(ctx, e, connectOptions{}, log)
		if err != nil {
			return fail(std, err)
		}
		if node != nil {
			defer node.Close()
		}
		if err := installFromServer(ctx, c, e.lay, *from, log); err != nil {
			return fail(std, err)
		}
		rt, err := fetch.Current(e.lay)
		if err != nil {
			return fail(std, err)
		}
		fmt.Fprintf(std.out, "installed Python %s in %s\n", rt.Version, rt.Dir)
		return exitOK
	case *url != "" && *sha != "" && *from == "":
		src = fetch.Source{URL: *url, Pin: fetch.Pin{SHA256: *sha, Size: *size}}
	default:
		return usageError(std.err, "runtime", "give --url and --sha256, or --from-server NAME")
	}
	rt, err := fetch.Install(ctx, e.lay, src, progressOptions(std, path.Base(src.URL)))
	if err != nil {
		return fail(std, err)
	}
	fmt.Fprintf(std.out, "installed Python %s in %s\n", rt.Version, rt.Dir)
	return exitOK
}

func runRuntimeStatus(std stdio, args []string) int {
	fs := newFlagSet("runtime", std, "Show the installed runtime, the Python executors would run with, and any download under way.")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	type status struct {
		Installed   *fetch.Runtime   `json:"installed"`
		Python      *agent.Python    `json:"python"`
		PythonError string           `json:"python_error,omitempty"`
		Downloads   []fetch.Progress `json:"downloads,omitempty"`
	}
	var s status
	if rt, err := fetch.Current(e.lay); err == nil {
		s.Installed = &rt
	}
	if py, err := findPython(e); err == nil {
		s.Python = &py
	} else {
		s.PythonError = err.Error()
	}
	s.Downloads = fetch.Downloading(e.lay)
	if *asJSON {
		b, _ := json.MarshalIndent(s, "", "  ")
		fmt.Fprintln(std.out, string(b))
		return exitOK
	}
	if s.Installed != nil {
		fmt.Fprintf(std.out, "installed:  Python %s in %s (archive sha256 %s)\n", s.Installed.Version, s.Installed.Dir, s.Installed.SHA256)
	} else {
		fmt.Fprintln(std.out, "installed:  none (metnos-agent runtime install --url URL --sha256 HEX)")
	}
	if s.Python != nil {
		fmt.Fprintf(std.out, "executors:  %s (%s)\n", s.Python.Path, s.Python.Source)
	} else {
		fmt.Fprintf(std.out, "executors:  no Python: %s\n", s.PythonError)
	}
	for _, d := range s.Downloads {
		fmt.Fprintf(std.out, "download:   %s: %d of %d bytes (resumes on the next install)\n", d.URL, d.Done, d.Total)
	}
	return exitOK
}
