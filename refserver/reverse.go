package refserver

import (
	"sort"
	"strings"
)

// Call is one executor call a reverse pattern translates into.
type Call struct {
	Executor string         `json:"executor"`
	Args     map[string]any `json:"args"`
}

// blobBatch is how many blob restores one move_files call carries.
const blobBatch = 100

// ReverseCalls translates an executor's reverse patterns and the payload
// of its result into executor calls to run on the same device, exactly
// as Metnos's build_remote_reverse_calls does (docs/protocol.md §10.1). Patterns it cannot
// translate are returned in unsupported, in order.
func ReverseCalls(patterns []string, payload map[string]any) (calls []Call, unsupported []string) {
	rows, _ := payload["results"].([]any)
	for _, p := range patterns {
		switch p {
		case "swap_src_dst":
			calls = append(calls, swapSrcDst(rows)...)
		case "delete_created_paths":
			var created []any
			for _, r := range rows {
				row, _ := r.(map[string]any)
				if path, ok := row["path"].(string); ok && path != "" && truthy(row["created"]) {
					created = append(created, path)
				}
			}
			if len(created) > 0 {
				calls = append(calls, Call{"delete_files", map[string]any{"paths": created, "client": "local"}})
			}
			if dirs := deepestFirst(payload["dirs_created"]); len(dirs) > 0 {
				calls = append(calls, Call{"delete_dirs", map[string]any{"paths": dirs}})
			}
		case "delete_created_dirs":
			if dirs := deepestFirst(payload["dirs_created"]); len(dirs) > 0 {
				calls = append(calls, Call{"delete_dirs", map[string]any{"paths": dirs}})
			}
		case "restore_blob_backup":
			var batch []any
			missing := false
			for _, r := range rows {
				row, ok := r.(map[string]any)
				if !ok {
					continue
				}
				bp, _ := row["blob_path"].(string)
				path, _ := row["path"].(string)
				switch {
				case bp != "" && path != "":
					batch = append(batch, map[string]any{"src": bp, "dst": path})
				case path != "":
					missing = true
				}
			}
			for i := 0; i < len(batch); i += blobBatch {
				calls = append(calls, Call{"move_files", map[string]any{
					"entries": batch[i:min(i+blobBatch, len(batch))], "dst_template": "{dst}",
					"parents": true, "copy": true, "client": "local",
				}})
			}
			if missing {
				unsupported = append(unsupported, p+":righe-senza-blob")
			}
		default:
			unsupported = append(unsupported, p)
		}
	}
	return calls, unsupported
}

// swapSrcDst moves every dst back to its src: one call per source folder
// when the name is unchanged, one literal call per rename.
func swapSrcDst(rows []any) []Call {
	type group struct {
		parent string
		paths  []any
	}
	var groups []*group
	byParent := map[string]*group{}
	var singles [][2]string
	for _, r := range rows {
		row, ok := r.(map[string]any)
		if !ok {
			continue
		}
		if _, imap := row["account"]; imap {
			continue
		}
		back, ok1 := row["src"].(string)
		now, ok2 := row["dst"].(string)
		if !ok1 || !ok2 || back == "" || now == "" || now == back {
			continue
		}
		nNow, nBack := baseName(now), baseName(back)
		if nNow == nBack && len(back) > len(nBack) {
			parent := back[:len(back)-len(nBack)]
			if nBack == "" {
				parent = "" // Python's back[:-0]
			}
			parent = strings.TrimRight(parent, `/\`)
			g := byParent[parent]
			if g == nil {
				g = &group{parent: parent}
				byParent[parent] = g
				groups = append(groups, g)
			}
			g.paths = append(g.paths, now)
			continue
		}
		singles = append(singles, [2]string{now, back})
	}
	var calls []Call
	for _, g := range groups {
		entries := make([]any, len(g.paths))
		for i, p := range g.paths {
			entries[i] = map[string]any{"src": p}
		}
		calls = append(calls, Call{"move_files", map[string]any{
			"entries": entries, "dst_template": g.parent + "/{name}", "parents": true, "client": "local",
		}})
	}
	for _, s := range singles {
		calls = append(calls, Call{"move_files", map[string]any{
			"entries": []any{map[string]any{"src": s[0]}}, "dst_template": s[1], "parents": true, "client": "local",
		}})
	}
	return calls
}

// baseName is the last path element as Python's PurePath.name gives it:
// Windows rules when the path has a '\' or a drive letter, POSIX rules
// otherwise.
func baseName(p string) string {
	windows := strings.Contains(p, `\`) || len(p) >= 2 && p[1] == ':'
	seps := "/"
	if windows {
		seps = `/\`
		if len(p) >= 2 && p[1] == ':' {
			p = p[2:]
		}
	}
	name := ""
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
		if seg != "." {
			name = seg
		}
	}
	return name
}

// deepestFirst returns the unique strings of v sorted deepest first (by
// count of '/'), ties in lexical order so the result is deterministic.
func deepestFirst(v any) []any {
	list, _ := v.([]any)
	seen := map[string]bool{}
	var dirs []string
	for _, e := range list {
		if s, ok := e.(string); ok && !seen[s] {
			seen[s] = true
			dirs = append(dirs, s)
		}
	}
	sort.Strings(dirs)
	sort.SliceStable(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	out := make([]any, len(dirs))
	for i, d := range dirs {
		out[i] = d
	}
	return out
}

// ScaledDeadlineMS is the deadline Metnos gives a reverse call: 30 s, or
// 30 s + 1 s per item when its longest list argument has more than 10
// items, capped at 600 s (remote_exec._scaled_timeout_s).
func ScaledDeadlineMS(args map[string]any) int64 {
	n := 0
	for _, v := range args {
		if l, ok := v.([]any); ok {
			n = max(n, len(l))
		}
	}
	if n <= 10 {
		return 30000
	}
	return int64(min(600, 30+n)) * 1000
}
