package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/wire"
)

// publish copies a build into a client mirror and records it in the
// mirror's manifest.json (refserver.Publish).
func publish(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("publish", flag.ContinueOnError)
	fl.SetOutput(stderr)
	mirror := fl.String("mirror", "", "client mirror directory (the real server's <data>/mirror/client)")
	version := fl.String("version", "", "version to publish under, such as 1.4.0")
	target := fl.String("target", "", "target, such as linux-amd64 (metnos-agent's are GOOS-GOARCH)")
	component := fl.String("component", wire.AgentComponent, "component name in the manifest")
	installers := fl.Bool("installers", false, "also write stand-in install.sh and install.ps1 where absent")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *mirror == "" {
		return errors.New("--mirror DIR is required")
	}
	if *installers {
		wrote, err := refserver.WriteInstallers(*mirror)
		for _, p := range wrote {
			fmt.Fprintf(stdout, "wrote stand-in installer %s\n", p)
		}
		if err != nil {
			return err
		}
		if fl.NArg() == 0 && *version == "" && *target == "" {
			return nil
		}
	}
	if fl.NArg() != 1 || *version == "" || *target == "" {
		return errors.New("want --version V --target T and one BINARY (see metnos-refserver help)")
	}
	f, err := os.Open(fl.Arg(0))
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", fl.Arg(0))
	}
	e, err := refserver.Publish(*mirror, *version, *target, *component, f)
	if err != nil {
		return err
	}
	var latest string
	if b, err := os.ReadFile(filepath.Join(*mirror, refserver.ManifestName)); err == nil {
		var m struct{ Latest string }
		json.Unmarshal(b, &m)
		latest = m.Latest
	}
	fmt.Fprintf(stdout, "published %s %s for %s: %s\n  size %d, sha256 %s\n  served at %s%s\n  manifest latest: %s\n",
		*component, *version, *target, filepath.Join(*mirror, filepath.FromSlash(e.Path)),
		e.Size, e.SHA256, wire.PathClientFiles, e.Path, latest)
	if latest != *version {
		fmt.Fprintf(stdout, "  note: %s is not the latest version, so no device is offered it\n", *version)
	}
	return nil
}

// join creates a join session on a running server and prints its link.
func join(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("join", flag.ContinueOnError)
	fl.SetOutput(stderr)
	server := fl.String("server", "http://127.0.0.1:8765", "base URL of a running metnos-refserver")
	platform := fl.String("platform", "auto", "auto, linux or windows")
	ttl := fl.Int("ttl", 0, "lifetime in seconds (0: the server's default, 1800)")
	asJSON := fl.Bool("json", false, "print the admin API's whole answer")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() != 1 {
		return errors.New("want one NAME (see metnos-refserver help)")
	}
	body := map[string]any{"name": fl.Arg(0), "platform": *platform}
	if *ttl != 0 {
		body["ttl_s"] = *ttl
	}
	var out strings.Builder
	if err := call(&out, "POST", strings.TrimRight(*server, "/")+"/admin/devices/join", body); err != nil {
		return err
	}
	if *asJSON {
		_, err := io.WriteString(stdout, out.String())
		return err
	}
	var m struct {
		JoinURL string `json:"join_url"`
	}
	if err := json.Unmarshal([]byte(out.String()), &m); err != nil || m.JoinURL == "" {
		return fmt.Errorf("the server's answer has no join_url: %s", out.String())
	}
	_, err := fmt.Fprintln(stdout, m.JoinURL)
	return err
}
