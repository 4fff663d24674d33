package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	neturl "net/url"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/schollz/progressbar/v3"
	xterm "golang.org/x/term"

	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/term"
)

func runFetch(std stdio, args []string) int {
	fs := newFlagSet("fetch", std, "Download URL to FILE in Range chunks, resuming what an earlier run left (FILE.part, FILE.part.json), and put it in place only if its SHA-256 matches the pin. URL may also be a local file (a path or file://), copied and checked the same way; -o may name an existing folder, to put the file in under the URL's name. A debugging door to what the runtime download does.")
	sha := fs.String("sha256", "", "the pinned SHA-256 of the file (64 `HEX` digits)")
	size := fs.Int64("size", 0, "the pinned size in bytes, `N` (0: unknown)")
	out := fs.String("o", "", "where to put the file: `FILE`, or a folder to put it in under the URL's name")
	chunk := fs.Int64("chunk", fetch.DefaultChunk, "`BYTES` per Range request")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() != 1 {
		return usageError(std.err, "fetch", "one URL is needed")
	}
	url := fs.Arg(0)
	if *sha == "" || *out == "" {
		return usageError(std.err, "fetch", "both --sha256 and -o are needed")
	}
	if b, err := hex.DecodeString(*sha); err != nil || len(b) != sha256.Size {
		return usageError(std.err, "fetch", "--sha256 %q is not 64 hex digits", *sha)
	}
	if *size < 0 {
		return usageError(std.err, "fetch", "--size %d is negative: give the size in bytes, or 0 when it is unknown", *size)
	}
	if *chunk <= 0 {
		return usageError(std.err, "fetch", "--chunk %d: give a positive number of bytes (default %d)", *chunk, fetch.DefaultChunk)
	}
	if fi, err := os.Stat(*out); err == nil && fi.IsDir() {
		// A folder: the file goes in it, under the URL's name.
		name := urlName(url)
		if name == "" {
			return usageError(std.err, "fetch", "%s names no file to put in %s: give -o %s", fetch.ShowURL(url), term.Sanitize(*out), term.Sanitize(filepath.Join(*out, "NAME")))
		}
		*out = filepath.Join(*out, name)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o, barShown := progressBar(std, filepath.Base(*out))
	o.Chunk = *chunk
	if err := fetch.File(ctx, url, *out, fetch.Pin{SHA256: *sha, Size: *size}, o); err != nil {
		if barShown() {
			fmt.Fprintln(std.err) // end the progress bar's line
		}
		fmt.Fprintf(std.err, "metnos-agent: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(std.out, "%s: verified (sha256 %s)\n", term.Sanitize(*out), strings.ToLower(*sha))
	return exitOK
}

// urlName returns the last element of raw's path (a URL's, or a local
// file's), or "" when it names no file.
func urlName(raw string) string {
	p := raw
	if u, err := neturl.Parse(raw); err == nil && u.Scheme != "" && len(u.Scheme) > 1 {
		p = u.Path
	}
	name := path.Base(filepath.ToSlash(p))
	if name == "." || name == "/" || name == ".." || strings.ContainsAny(name, `\:`) {
		return ""
	}
	return name
}

// progressOptions reports a download's progress as a bar when stderr is
// a terminal, as log lines (every 10 %) otherwise.
func progressOptions(std stdio, name string) fetch.Options {
	o, _ := progressBar(std, name)
	return o
}

// progressBar is progressOptions; barShown reports whether a bar was
// drawn (its line is then left open).
func progressBar(std stdio, name string) (o fetch.Options, barShown func() bool) {
	log := slog.New(slog.NewTextHandler(std.err, &slog.HandlerOptions{Level: slog.LevelInfo}))
	o = fetch.Options{Logger: log}
	var bar *progressbar.ProgressBar
	barShown = func() bool { return bar != nil }
	if f, ok := std.err.(*os.File); ok && xterm.IsTerminal(int(f.Fd())) {
		o.Logger = slog.New(slog.NewTextHandler(std.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
		o.Progress = func(p fetch.Progress) {
			if bar == nil {
				bar = progressbar.DefaultBytes(p.Total, name)
			}
			if p.Pass == 2 {
				bar.Describe(name + " (again, chunk by chunk)")
			}
			bar.Set64(p.Done)
		}
		return o, barShown
	}
	last := int64(-1)
	o.Progress = func(p fetch.Progress) {
		if p.Total > 0 && p.Done*10/p.Total != last {
			last = p.Done * 10 / p.Total
			log.Info("download progress", "file", name, "done", p.Done, "total", p.Total, "pass", max(p.Pass, 1))
		}
	}
	return o, barShown
}
