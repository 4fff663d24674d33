package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/windows"

	"github.com/metnos/agent/internal/fspath"
)

// scratchPrefix starts the name of every run's scratch folder:
// metnos-exec-<agent pid>-<32 hex> in the agent's TEMP (docs/protocol.md §12.4).
const scratchPrefix = "metnos-exec-"

// newScratch creates a fresh, empty scratch folder for one run.
func newScratch() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("sandbox: naming a scratch folder: %w", err)
	}
	dir := filepath.Join(os.TempDir(), scratchPrefix+strconv.Itoa(os.Getpid())+"-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("sandbox: creating scratch folder %s: %w", dir, err)
	}
	return dir, nil
}

// removeTree removes dir and everything in it. It tries os.RemoveAll,
// then entry by entry, deepest first (Wine 8.0 does not implement what
// os.RemoveAll needs, and a file of a process that just died can stay
// locked for a moment), a few times before giving up.
func removeTree(dir string) error {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		}
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		if err = fspath.RemoveBottomUp(dir); err == nil {
			return nil
		}
	}
	return fmt.Errorf("sandbox: removing %s: %w", dir, err)
}

var staleScratchOnce sync.Once

// removeStaleScratch removes, once per process, the scratch folders of
// runs whose agent died mid-run (named for a pid no process has now).
func removeStaleScratch(log *slog.Logger) {
	staleScratchOnce.Do(func() {
		matches, _ := filepath.Glob(filepath.Join(os.TempDir(), scratchPrefix+"*-*"))
		for _, m := range matches {
			pid, ok := scratchPID(filepath.Base(m))
			if !ok || pid == os.Getpid() || processExists(uint32(pid)) {
				continue
			}
			if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
				if err := removeTree(m); err != nil {
					log.Debug("sandbox: stale scratch folder left in place", "path", m, "err", err)
				}
			}
		}
	})
}

// scratchPID reads the agent pid out of a scratch folder's name.
func scratchPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, scratchPrefix)
	if !ok {
		return 0, false
	}
	pidText, tail, ok := strings.Cut(rest, "-")
	if !ok || len(tail) != 32 {
		return 0, false
	}
	if _, err := hex.DecodeString(tail); err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(pidText)
	return pid, err == nil && pid > 0
}

// processExists reports whether a process with this pid exists (or
// might: any answer but "no such process" counts as yes).
func processExists(pid uint32) bool {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, pid)
	if err != nil {
		return !errors.Is(err, windows.ERROR_INVALID_PARAMETER)
	}
	defer windows.CloseHandle(h)
	var code uint32
	if windows.GetExitCodeProcess(h, &code) != nil {
		return true
	}
	return code == 259 // STILL_ACTIVE
}
