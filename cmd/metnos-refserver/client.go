package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// client runs the subcommands that call a running server's admin API.
func client(cmd string, args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet(cmd, flag.ContinueOnError)
	server := fl.String("server", "http://127.0.0.1:8765", "base URL of a running metnos-refserver")
	ttl := fl.Int("ttl", 600, "token lifetime in seconds (token)")
	turn := fl.String("turn", "", "turn_id (enqueue)")
	rev := fl.String("reversibility", "", "read_only or revertible (enqueue)")
	deadline := fl.Int64("deadline-ms", 0, "deadline_ms, 0 = 60000 (enqueue)")
	id := fl.String("id", "", "invocation id, default generated (enqueue)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	pos := fl.Args()
	need := map[string]int{"token": 1, "enqueue": 3, "get": 1, "undo": 2}[cmd]
	if len(pos) != need {
		return fmt.Errorf("want %d arguments, got %d (see metnos-refserver help)", need, len(pos))
	}
	base := strings.TrimRight(*server, "/")
	switch cmd {
	case "token":
		return call(stdout, "POST", base+"/admin/token", map[string]any{"name": pos[0], "ttl_s": *ttl})
	case "enqueue":
		var a json.RawMessage
		if !json.Valid([]byte(pos[2])) {
			return fmt.Errorf("ARGS_JSON %q is not JSON", pos[2])
		}
		a = json.RawMessage(pos[2])
		return call(stdout, "POST", base+"/admin/enqueue", map[string]any{"device_id": pos[0], "executor": pos[1], "args": a,
			"turn_id": *turn, "reversibility": *rev, "deadline_ms": *deadline, "id": *id})
	case "get":
		return call(stdout, "GET", base+"/admin/invocation/"+url.PathEscape(pos[0]), nil)
	default: // undo
		return call(stdout, "POST", base+"/admin/undo", map[string]any{"device_id": pos[0], "turn_id": pos[1]})
	}
}

// call sends one admin request and prints the JSON answer indented.
func call(stdout io.Writer, method, u string, body any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("%w (is metnos-refserver serve running there?)", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		out.Reset()
		out.Write(b)
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status + ": " + strings.TrimSpace(out.String()))
	}
	out.WriteByte('\n')
	_, err = stdout.Write(out.Bytes())
	return err
}
