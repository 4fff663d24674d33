package examples

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/metnos/agent/undo"
)

// recorded is a run of an upstream Metnos file executor, recorded by
// undo/testdata/upstream/record.py.
type recorded struct {
	Executor string                     `json:"executor"`
	Reverse  []string                   `json:"reverse_patterns"`
	Args     any                        `json:"args"`
	Before   map[string]recordedFile    `json:"before"`
	After    map[string]recordedFile    `json:"after"`
	Result   map[string]any             `json:"result"`
	Blobs    map[string]json.RawMessage `json:"blobs"`
}

type recordedFile struct {
	Dir     bool   `json:"dir"`
	B64     string `json:"b64"`
	Mode    uint32 `json:"mode"`
	MtimeNS int64  `json:"mtime_ns"`
}

// contents is a folder's files and folders by path relative to root
// (a folder as "dir", a file as its bytes in base64 and its mode).
func contents(t *testing.T, root string, files map[string]recordedFile) map[string]string {
	t.Helper()
	out := map[string]string{}
	for rel, f := range files {
		if f.Dir {
			out[rel] = "dir"
		} else {
			out[rel] = f.B64 + " " + os.FileMode(f.Mode).String()
		}
	}
	return out
}

// onDisk is contents of what is under root/d now.
func onDisk(t *testing.T, root string) map[string]recordedFile {
	t.Helper()
	out := map[string]recordedFile{}
	filepath.Walk(filepath.Join(root, "d"), func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == filepath.Join(root, "d") {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if fi.IsDir() {
			out[rel] = recordedFile{Dir: true}
			return nil
		}
		b, _ := os.ReadFile(p)
		out[rel] = recordedFile{B64: base64.StdEncoding.EncodeToString(b), Mode: uint32(fi.Mode().Perm()), MtimeNS: fi.ModTime().UnixNano()}
		return nil
	})
	return out
}

// TestRowsAreUpstreams: each mutating example executor, run on the
// folder and with the arguments an upstream Metnos executor was
// recorded with, leaves the same folder and writes result rows with
// (at least) the upstream rows' fields, so that the demo and the e2e
// tests exercise the shapes the real executors write; and a device's
// local undo of its result puts the folder back byte for byte, with
// modes and times.
func TestRowsAreUpstreams(t *testing.T) {
	for _, name := range []string{"write_files", "move_files", "move_files_overwrite", "create_dirs", "delete_files", "delete_dirs"} {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "undo", "testdata", "upstream", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			r := newRunner(t)
			root := t.TempDir()
			raw = bytes.ReplaceAll(raw, []byte("@ROOT@"), []byte(root))
			var rec recorded
			if err := json.Unmarshal(raw, &rec); err != nil {
				t.Fatal(err)
			}
			os.MkdirAll(filepath.Join(root, "d", "empty"), 0o755)
			for _, rel := range slices.Sorted(maps.Keys(rec.Before)) {
				f, p := rec.Before[rel], filepath.Join(root, rel)
				if f.Dir {
					os.MkdirAll(p, 0o755)
					continue
				}
				b, _ := base64.StdEncoding.DecodeString(f.B64)
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, b, 0o600)
				os.Chmod(p, os.FileMode(f.Mode))
				os.Chtimes(p, time.Unix(0, f.MtimeNS), time.Unix(0, f.MtimeNS))
			}
			m := readManifest(t, Executors, rec.Executor)
			if !slices.Equal(m.ReversePattern, rec.Reverse) && !(rec.Executor == "delete_files" && slices.Equal(m.ReversePattern, rec.Reverse[:1])) {
				t.Errorf("reverse patterns %v, upstream %v", m.ReversePattern, rec.Reverse)
			}
			args, _ := json.Marshal(rec.Args)
			out, errb := r.runRaw(t, rec.Executor, args, "METNOS_HISTORY_DIR="+filepath.Join(root, "hist"), "METNOS_TURN_ID=turn-rec")
			dec := json.NewDecoder(bytes.NewReader(out))
			dec.UseNumber()
			var got map[string]any
			if err := dec.Decode(&got); err != nil || got["ok"] != true {
				t.Fatalf("%s: %s %v\n%s", rec.Executor, out, err, errb)
			}
			if want, have := contents(t, root, rec.After), contents(t, root, onDisk(t, root)); !maps.Equal(want, have) {
				t.Errorf("the folder after the run:\n%v\nupstream leaves\n%v", have, want)
			}
			rows, _ := got["results"].([]any)
			wantRows, _ := rec.Result["results"].([]any)
			if len(rows) != len(wantRows) {
				t.Fatalf("%d rows, upstream %d:\n%s", len(rows), len(wantRows), out)
			}
			for i := range rows {
				row, want := rows[i].(map[string]any), wantRows[i].(map[string]any)
				for k, v := range want {
					switch k {
					case "atime_ns", "bytes_written", "mode_octal":
						if _, ok := row[k]; !ok {
							t.Errorf("row %d: no %s: %v (upstream %v)", i, k, row, want)
						}
					default:
						if g, _ := json.Marshal(row[k]); string(g) != mustJSON(v) {
							t.Errorf("row %d: %s = %s, upstream %s", i, k, g, mustJSON(v))
						}
					}
				}
			}
			if g, w := mustJSON(got["dirs_created"]), mustJSON(rec.Result["dirs_created"]); rec.Result["dirs_created"] != nil && g != w {
				t.Errorf("dirs_created %s, upstream %s", g, w)
			}

			// The device's local undo of it.
			j, err := undo.Open(filepath.Join(root, "journal"))
			if err != nil {
				t.Fatal(err)
			}
			j.Begin(undo.Begin{InvocationID: "inv", Executor: rec.Executor, Reverse: m.ReversePattern,
				Roots: []string{filepath.Join(root, "d")}, History: filepath.Join(root, "hist")})
			if _, err := j.Finish("inv", undo.Outcome{OK: true, Payload: got}); err != nil {
				t.Fatal(err)
			}
			rep, err := j.Undo("inv", filepath.Join(root, "hist"), false)
			if rec.Executor == "delete_dirs" {
				if err == nil {
					t.Fatalf("delete_dirs undone: %+v", rep)
				}
				return
			}
			if err != nil || len(rep.Conflicts) > 0 || len(rep.Unsupported) > 0 {
				t.Fatalf("local undo: %+v %v", rep, err)
			}
			now := onDisk(t, root)
			if want, have := contents(t, root, rec.Before), contents(t, root, now); !maps.Equal(want, have) {
				t.Errorf("after the undo:\n%v\nbefore the run\n%v", have, want)
			}
			for rel, f := range rec.Before {
				if !f.Dir && now[rel].MtimeNS != f.MtimeNS {
					t.Errorf("%s: modified %d, was %d", rel, now[rel].MtimeNS, f.MtimeNS)
				}
			}
		})
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }
