//go:build linux && amd64

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
	"github.com/metnos/agent/refserver"
)

// The agent's append-only files, as this test names them.
const (
	fileLedger  = "ledger"  // spool/executed.log
	fileJournal = "journal" // history/*.jsonl
	fileAudit   = "audit"   // audit/*.jsonl
	fileLog     = "log"     // client.log
)

// appendOnly names the append-only file of the data directory dd that
// path is, or "".
func appendOnly(dd, path string) string {
	rel, err := filepath.Rel(dd, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return ""
	}
	switch dir, base := filepath.Split(rel); {
	case rel == filepath.Join("spool", "executed.log"):
		return fileLedger
	case dir == "history/" && strings.HasSuffix(base, chainlog.Ext):
		return fileJournal
	case dir == "audit/" && strings.HasSuffix(base, chainlog.Ext):
		return fileAudit
	case rel == "client.log":
		return fileLog
	}
	return ""
}

// killPoint is where a traced agent is killed: at the k-th write(2) to
// one of its append-only files, before it (nothing of that write on
// disk) or, torn, after the first half of its bytes were written (what
// a power cut in the middle of a write leaves).
type killPoint struct {
	file string
	k    int
	torn bool
}

// tracedWrite is one write(2) the tracer saw.
type tracedWrite struct {
	file string // appendOnly's name
	path string
	n    int // bytes asked for
	k    int // the how-manieth write to file
}

// traced is an agent run under ptrace.
type traced struct {
	pid    int
	done   chan struct{}
	writes []tracedWrite // every write to an append-only file, in order
	killed *tracedWrite  // the write it was killed at
	err    error         // the tracer's own failure
}

// startTraced runs the agent under a tracer of its own, which counts
// its writes to its append-only files across all its threads and kills
// it (SIGKILL) at kp. strace counts a write's number per thread (man
// strace: "per syscall and per tracee"), and a Go program writes from
// whichever thread runs the goroutine, so "the N-th write" of the
// agent needs this count over the whole process. The programs the
// agent starts (bubblewrap, the executors) are not traced.
func (w *world) startTraced(t *testing.T, kp killPoint) *traced {
	t.Helper()
	w.runs++
	logPath := filepath.Join(w.dir, fmt.Sprintf("agent-%d.log", w.runs))
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	dd := w.dataDir()
	tr := &traced{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(tr.done)
		defer out.Close()
		// ptrace requests must come from the thread that started the
		// tracee: this goroutine keeps it, and the thread ends with it.
		runtime.LockOSThread()
		cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "run")
		cmd.Env = w.env()
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true, Setpgid: true}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		tr.pid = cmd.Process.Pid
		started <- nil
		tr.err = tr.trace(tr.pid, dd, kp)
	}()
	if err := <-started; err != nil {
		if errors.Is(err, syscall.EPERM) {
			if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
				t.Fatalf("ptrace is not permitted here (%v; METNOS_REQUIRE_SANDBOX=1 makes this a failure)", err)
			}
			t.Skipf("ptrace is not permitted here (%v): the agent cannot be killed at a given write", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-tr.pid, syscall.SIGKILL)
		<-tr.done
	})
	return tr
}

// Constants of ptrace(2) the syscall package does not name.
const (
	ptraceOExitKill = 0x100000 // PTRACE_O_EXITKILL
	wNoThread       = 0x20000000
	syscallStop     = syscall.SIGTRAP | 0x80
)

// trace follows the agent's threads from their first stop to their
// exit, on the locked thread that started it.
func (tr *traced) trace(pid int, dd string, kp killPoint) error {
	var ws syscall.WaitStatus
	// The agent stops at its exec.
	if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != nil {
		return fmt.Errorf("waiting for the traced agent to start: %w", err)
	}
	if err := syscall.PtraceSetOptions(pid, syscall.PTRACE_O_TRACECLONE|syscall.PTRACE_O_TRACESYSGOOD|ptraceOExitKill); err != nil {
		return fmt.Errorf("ptrace options: %w", err)
	}
	if err := syscall.PtraceSyscall(pid, 0); err != nil {
		return fmt.Errorf("ptrace: %w", err)
	}
	inCall := map[int]bool{} // a thread between a syscall's entry and exit
	seen := map[int]bool{pid: true}
	killAfter := -1 // the thread whose torn write ends with the kill
	count := map[string]int{}
	for {
		tid, err := syscall.Wait4(-1, &ws, syscall.WALL|wNoThread, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.ECHILD) {
			return nil // every thread gone
		}
		if err != nil {
			return fmt.Errorf("wait4: %w", err)
		}
		if ws.Exited() || ws.Signaled() {
			delete(inCall, tid)
			continue
		}
		if !ws.Stopped() {
			continue
		}
		sig := ws.StopSignal()
		switch {
		case !seen[tid]:
			// A new thread's first stop (SIGSTOP).
			seen[tid] = true
			sig = 0
		case sig == syscallStop && !inCall[tid]:
			inCall[tid] = true
			sig = 0
			var regs syscall.PtraceRegs
			if syscall.PtraceGetRegs(tid, &regs) != nil {
				break
			}
			if regs.Orig_rax != syscall.SYS_WRITE && regs.Orig_rax != syscall.SYS_PWRITE64 {
				break
			}
			path, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, int(regs.Rdi)))
			file := appendOnly(dd, path)
			if file == "" {
				break
			}
			count[file]++
			wr := tracedWrite{file: file, path: path, n: int(regs.Rdx), k: count[file]}
			tr.writes = append(tr.writes, wr)
			if file != kp.file || count[file] != kp.k {
				break
			}
			tr.killed = &wr
			if kp.torn && regs.Rdx >= 2 {
				regs.Rdx /= 2
				if err := syscall.PtraceSetRegs(tid, &regs); err != nil {
					return fmt.Errorf("ptrace: shortening a write: %w", err)
				}
				killAfter = tid
			} else {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		case sig == syscallStop:
			inCall[tid] = false
			sig = 0
			if tid == killAfter {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		case sig == syscall.SIGTRAP && ws.TrapCause() > 0:
			sig = 0 // a clone event
		}
		syscall.PtraceSyscall(tid, int(sig))
	}
}

// count is how many writes to file the tracer saw.
func (tr *traced) count(file string) int {
	n := 0
	for _, w := range tr.writes {
		if w.file == file {
			n++
		}
	}
	return n
}

// resultsIn reports whether every one of ids has a result.
func (w *world) resultsIn(ids ...string) bool {
	for _, id := range ids {
		if info, _ := w.srv.Invocation(id); info.ResultBody == nil {
			return false
		}
	}
	return true
}

// wait waits for the traced agent to be killed (or to end).
func (tr *traced) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-tr.done:
	case <-time.After(within):
		t.Fatalf("the traced agent was not killed within %s (writes seen: %d)", within, len(tr.writes))
	}
	if tr.err != nil {
		t.Fatalf("the tracer: %v", tr.err)
	}
}

// ledgerID begins a line of spool/executed.log: one invocation id (of
// the reference server's shape), then whatever else the ledger keeps of
// it. ledgerFenced is what may be left of one a kill tore, when the
// ledger ends it with a newline before appending rather than cutting
// it. Never two ids on one line.
var (
	ledgerID     = regexp.MustCompile(`^inv-[0-9a-f]{16,64}\b`)
	ledgerFenced = regexp.MustCompile(`^(i|in|inv|inv-[0-9a-f]*)$`)
)

// checkAppendOnly fails unless every line of each append-only file of
// the data directory dd is whole: every id of the ledger alone on its
// line, every line of the log JSON, the journal and the audit log
// verified. It returns the ledger's ids.
func checkAppendOnly(t *testing.T, w *world) []string {
	t.Helper()
	dd := w.dataDir()
	for _, p := range []string{filepath.Join(dd, "spool", "executed.log"), filepath.Join(dd, "client.log")} {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 && b[len(b)-1] != '\n' {
			t.Errorf("%s ends in a line cut short, after an append: %.100q", p, b[max(0, len(b)-100):])
		}
	}
	var ids []string
	for i, l := range lines(t, filepath.Join(dd, "spool", "executed.log")) {
		id := ledgerID.FindString(l)
		switch {
		case strings.Count(l, "inv-") > 1 || (id == "" && !ledgerFenced.MatchString(l)):
			t.Errorf("spool/executed.log line %d is not one invocation's: %q (glued onto a torn one?)", i+1, l)
		case id == "":
			t.Logf("spool/executed.log line %d is what a kill left of an id, fenced: %q", i+1, l)
		default:
			ids = append(ids, id)
		}
	}
	for _, name := range []string{"client.log.1", "client.log"} {
		b, err := os.ReadFile(filepath.Join(dd, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
			if !json.Valid(l) {
				t.Errorf("%s line %d is not a JSON line: %.300q", name, i+1, l)
			}
		}
	}
	for _, dir := range []string{"history", "audit"} {
		rep, err := chainlog.Verify(filepath.Join(dd, dir))
		if err != nil || !rep.OK() || rep.Note != "" {
			t.Errorf("%s does not verify: %v %v", dir, rep, err)
		}
		err = chainlog.Read(filepath.Join(dd, dir), func(file string, line []byte) error {
			if !json.Valid(line) {
				return fmt.Errorf("%s: a line is not JSON: %.300q", file, line)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
	if code, out := w.cli("audit", "verify"); code != 0 || !strings.Contains(out, "intact") {
		t.Errorf("metnos-agent audit verify: exit %d\n%s", code, out)
	}
	return ids
}

// TestTornFiles kills the agent at every write to each of its
// append-only files (the ledger spool/executed.log, the history
// journal, the audit log, client.log) while it handles a write_files
// invocation and then a touch_once (an executor that counts its runs
// in a file), before the write and, torn, half-way through it; then
// restarts it. Each time: both invocations end with a result the
// server accepted (done, or execution_outcome_unknown when the kill
// landed after the ledger said it would run), neither ran twice, no
// file has a line glued onto a torn one, the journal and the audit log
// verify, and history lists the change once.
//
// The writes of one round are counted by a first round killed nowhere.
// Every write is a kill point before it; torn, every write of the
// ledger, journal and audit log and every 3rd of client.log (its
// lines are all alike, and each round costs a restart), to keep the
// test within a few minutes on two cores.
func TestTornFiles(t *testing.T) {
	t.Setenv("TMPDIR", "/var/tmp")
	// one runs one round in a world of its own: the traced agent,
	// killed at kp, then an agent restarted until both invocations
	// have their results.
	one := func(t *testing.T, kp killPoint) []tracedWrite {
		w := newWorld(t, shortGrace)
		w.pair()
		notes := filepath.Join(w.work, "notes")
		if err := os.MkdirAll(notes, 0o755); err != nil {
			t.Fatal(err)
		}
		tag := "r"
		path := filepath.Join(notes, tag+".txt")
		content := "round " + tag + "\n"
		tr := w.startTraced(t, kp)
		turn := "turn-" + tag
		wf := w.enqueue("write_files", map[string]any{"files": []any{map[string]any{"path": path, "content": content}}},
			refserver.EnqueueOptions{TurnID: turn, Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": turn}, DeadlineMS: 5000})
		to := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": tag},
			refserver.EnqueueOptions{Reversibility: "read_only", DeadlineMS: 5000})
		ids := []string{wf, to}
		// Wait for the kill; when both results are in first (no kill
		// point, or one the round did not reach), stop the agent: its
		// last writes, as it stops, are kill points too.
		var answered time.Time
		for ; ; time.Sleep(20 * time.Millisecond) {
			select {
			case <-tr.done:
			default:
				if answered.IsZero() && w.resultsIn(ids...) {
					answered = time.Now()
				}
				if answered.IsZero() || time.Since(answered) < time.Second {
					continue
				}
				syscall.Kill(tr.pid, syscall.SIGTERM)
			}
			break
		}
		tr.wait(t, 60*time.Second)
		if kp.file == fileLog && tr.killed == nil {
			// How much the agent logs depends on timing (a poll more or
			// less); the other files' writes do not.
			t.Skipf("this round wrote %d lines to client.log, fewer than the %d of the first", tr.count(fileLog), kp.k)
		}
		if kp.file != "" && tr.killed == nil {
			t.Fatalf("the agent made only %d writes, none the %d-th to the %s", len(tr.writes), kp.k, kp.file)
		}
		if k := tr.killed; k != nil {
			how := "before"
			if kp.torn {
				how = "half-way through"
			}
			t.Logf("killed %s write %d to the append-only files (write %d to the %s): %d bytes to %s", how, len(tr.writes), kp.k, kp.file, k.n, filepath.Base(k.path))
		}
		p := w.start()
		infos := map[string]refserver.InvocationInfo{}
		for _, id := range ids {
			infos[id] = w.wait(id)
		}
		// One more change, so that each file is appended to after what
		// the kill left.
		afterPath := filepath.Join(notes, "after.txt")
		after := w.wait(w.enqueue("write_files", map[string]any{"files": []any{map[string]any{"path": afterPath, "content": "after\n"}}},
			refserver.EnqueueOptions{TurnID: "turn-after", Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": "turn-after"}}))
		if r := result(t, after); after.State != "done" || r["ok"] != true {
			t.Errorf("the change after the restart: %s %s", after.State, after.ResultBody)
		}
		p.stop(t)

		ran := 0
		for _, l := range lines(t, filepath.Join(w.work, "ran.log")) {
			if l == tag {
				ran++
			}
		}
		got, _ := os.ReadFile(path)
		for _, id := range ids {
			info := infos[id]
			r := result(t, info)
			switch {
			case r["ok"] == true && info.State == "done":
			case r["error_class"] == "execution_outcome_unknown":
				t.Logf("%s (%s): of unknown outcome, the kill having landed during its run", id, info.Executor)
			default:
				t.Errorf("%s (%s): %s, neither done nor of unknown outcome: %s", id, info.Executor, info.State, info.ResultBody)
			}
			sameBodies(t, info)
		}
		if r := result(t, infos[to]); ran > 1 || (r["ok"] == true && ran != 1) {
			t.Errorf("touch_once ran %d times (result ok: %v)", ran, r["ok"])
		}
		if r := result(t, infos[wf]); r["ok"] == true && string(got) != content {
			t.Errorf("write_files reported done, but %s holds %q", path, got)
		}
		ledger := checkAppendOnly(t, w)
		for _, id := range ids {
			if c := slices.Index(ledger, id); c >= 0 && slices.Index(ledger[c+1:], id) >= 0 {
				t.Errorf("the ledger holds %s twice: it ran again", id)
			}
		}
		// history lists the change, once, when it was made.
		code, out := w.cli("history", "--json", "-n", "0")
		if code != 0 {
			t.Fatalf("history: exit %d\n%s", code, out)
		}
		var h struct {
			Problem string         `json:"problem"`
			Entries []historyEntry `json:"entries"`
		}
		if err := json.Unmarshal([]byte(out), &h); err != nil || h.Problem != "" {
			t.Fatalf("history --json: %v %s\n%s", err, h.Problem, out)
		}
		listed := map[string]int{}
		for _, e := range h.Entries {
			listed[e.InvocationID]++
		}
		switch n := listed[wf]; {
		case n > 1:
			t.Errorf("history lists the write_files %d times", n)
		case n == 0 && got != nil:
			t.Errorf("%s was written, but history does not list the change", path)
		}
		if n := listed[after.ID]; n != 1 {
			t.Errorf("history lists the change after the restart %d times, want once", n)
		}
		return tr.writes
	}

	// Not a subtest: -run picking some kill points still counts them.
	writes := one(t, killPoint{})
	if t.Failed() {
		t.FailNow()
	}
	total := map[string]int{}
	for _, wr := range writes {
		total[wr.file] = max(total[wr.file], wr.k)
	}
	t.Logf("one round writes %d times to its append-only files: %v", len(writes), total)
	for _, file := range []string{fileLedger, fileJournal, fileAudit, fileLog} {
		if total[file] == 0 {
			t.Errorf("one round wrote nothing to the %s", file)
		}
		for k := 1; k <= total[file]; k++ {
			for _, torn := range []bool{false, true} {
				if torn && file == fileLog && k%3 != 1 {
					continue
				}
				name := fmt.Sprintf("%s/%d/before", file, k)
				if torn {
					name = fmt.Sprintf("%s/%d/torn", file, k)
				}
				t.Run(name, func(t *testing.T) { one(t, killPoint{file: file, k: k, torn: torn}) })
			}
		}
	}
}
