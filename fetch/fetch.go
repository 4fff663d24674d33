// Package fetch downloads a file whose SHA-256 is pinned, in Range
// chunks, so that a crash, a reboot or a flaky link costs at most the
// chunk in flight, and so that nothing that misses its pin is ever put
// in place.
//
// # What File guarantees
//
//   - The file at the destination exists only if its bytes hash to the
//     pin (and have the pinned size, when one is given). It is written as
//     dst.part, renamed into place, and its directory fsynced.
//   - Progress survives a crash (dst.part.lock, which keeps a second
//     download of dst away, stays with it; it is removed once dst is in
//     place): dst.part.json records the URL, the pin,
//     the server's validator (ETag, else Last-Modified) and how many
//     bytes of dst.part are fsynced. A resumed download truncates dst.part
//     to that, hashes the prefix again and goes on from there.
//   - Chunks are 8,000,000 bytes, asked for with Range, If-Range (once a
//     validator is known) and Accept-Encoding: identity. A chunk counts
//     only as a 206 whose Content-Range is exactly the range asked for and
//     whose body is exactly that long. A 200 (a server that ignores Range,
//     or a file that changed, per If-Range) restarts the download from
//     zero and is streamed whole: a 200 body is never appended. A 416 on a
//     file already complete is not an error.
//   - What no retry can mend fails at once: a URL that is not http://
//     or https:// (nor a local file), a 4xx answer but 408 and 429, a
//     size that contradicts the pin, an HTML page instead of the file.
//   - Anything else (a connection error, a 5xx) is tried up to 10 times
//     per chunk, with backoff, before the download fails. A server that
//     sends nothing for the idle timeout (30 s) counts as a failed
//     attempt, "no data for 30 s from HOST", and 3 of those in a row end
//     the download (there is no whole-request timeout).
//   - A local file (a path, or a file:// URL) is copied through
//     dst.part and put in place only if it matches the pin.
//   - The destination's folder must exist, and dst must not be a
//     folder: both are checked before anything is downloaded.
//   - A dst.part.json that cannot be a download's state (not JSON,
//     counts that contradict each other) is discarded, with a warning,
//     and the download starts over.
//   - When the finished file misses the pin, one more pass fetches every
//     chunk twice, keeps it only when both copies agree, and must still
//     match the pin. Two copies that agree but miss the pin are an error
//     (the pin, or the upstream file, is wrong): agreement is not trust.
//
// # What it does not guarantee
//
//   - Authenticity comes from the pin alone: the transport may be plain
//     HTTP. A wrong pin means no file, never a wrong file.
//   - Disk space is not reserved: a full disk ends the download with the
//     error, dst.part kept for a later resume.
package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/internal/term"
)

// Defaults of [Options].
const (
	DefaultChunk    = 8_000_000
	DefaultAttempts = 10
	DefaultIdle     = 30 * time.Second
	DefaultParallel = 1
)

// Pin is what the downloaded bytes must be.
type Pin struct {
	// SHA256 is the lower- or upper-case hex digest.
	SHA256 string
	// Size is the length in bytes; 0 when unknown.
	Size int64
}

// Progress is reported as a download goes.
type Progress struct {
	URL   string
	Done  int64
	Total int64 // 0 when not known yet
	// Pass is 1 for the download, 2 for the agreement pass.
	Pass int
}

// Options tune [File]. Zero fields take the defaults.
type Options struct {
	Chunk    int64
	Attempts int
	// Idle is how long a response may send nothing before the attempt
	// is abandoned.
	Idle time.Duration
	// Client makes the requests (nil: one that follows redirects,
	// without a global timeout).
	Client *http.Client
	Logger *slog.Logger
	// Progress, when set, is called after every chunk.
	Progress func(Progress)
	// Backoff is the first pause between attempts (300 ms); it doubles
	// up to 5 s, with jitter.
	Backoff time.Duration
	// MaxSize, when set, bounds a file whose pin has no size: a server
	// that says the file is larger, or sends more, is refused before
	// more than that is written (the pin's sha256 alone would only be
	// checked at the end, with the disk full by then).
	MaxSize int64
	// Parallel is how many chunks are fetched at once (1). More overlap
	// the round trips of a slow link, at the cost of a chunk of memory
	// each; over loopback one at a time was faster (test/bench). Chunks
	// are committed in order, so a crash costs at most these.
	Parallel int
}

func (o *Options) defaults() {
	if o.Chunk <= 0 {
		o.Chunk = DefaultChunk
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultAttempts
	}
	if o.Idle <= 0 {
		o.Idle = DefaultIdle
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Client.CheckRedirect == nil {
		c := *o.Client
		c.CheckRedirect = checkRedirect
		o.Client = &c
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Backoff <= 0 {
		o.Backoff = 300 * time.Millisecond
	}
	if o.Parallel <= 0 {
		o.Parallel = DefaultParallel
	}
}

// ErrPinMismatch is wrapped when the bytes, fetched twice and agreeing,
// do not match the pin: the pin or the upstream file is wrong.
var ErrPinMismatch = errors.New("the file does not match its pin")

// state is dst.part.json.
type state struct {
	URL          string `json:"url"`
	SHA256       string `json:"sha256"`
	Size         int64  `json:"size"`
	Total        int64  `json:"total"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
	Committed    int64  `json:"committed"`
}

func (st *state) validator() string {
	if st.ETag != "" && !strings.HasPrefix(st.ETag, "W/") {
		return st.ETag
	}
	return st.LastModified
}

// download is one File call.
type download struct {
	url, dst string
	// shown is url as messages and logs name it: its password
	// redacted, its control characters escaped.
	shown    string
	pin      Pin
	o        Options
	st       state
	part     *os.File
	h        hash.Hash
	sync     *syncer
	restarts int
}

// File downloads url to dst, verified against pin; see the package doc.
// When dst already exists and matches the pin, it returns at once.
//
// Its errors and logs name url with its password redacted and its
// control characters escaped.
func File(ctx context.Context, url, dst string, pin Pin, o Options) error {
	o.defaults()
	shown := ShowURL(url)
	pin.SHA256 = strings.ToLower(pin.SHA256)
	if err := pin.check(); err != nil {
		return fmt.Errorf("fetch %s: %w", shown, err)
	}
	local, err := source(url)
	if err != nil {
		return err
	}
	if err := checkDestination(shown, dst); err != nil {
		return err
	}
	// One download of a file at a time: another would cut dst.part from
	// under this one. The lock file stays while a download is left to
	// resume; it goes, still held, once the file is in place (a download
	// that opened it just before finds the file in place and stops).
	lockPath := dst + ".part.lock"
	lock, err := lockfile.Lock(lockPath)
	switch {
	case errors.Is(err, lockfile.ErrLocked):
		return fmt.Errorf("fetch %s: another download to %s is running (%w): wait for it, or stop it", shown, term.Sanitize(dst), err)
	case err != nil:
		return fmt.Errorf("fetch %s: cannot create the lock file next to %s: %w", shown, term.Sanitize(dst), unwrapPath(err))
	}
	done := false
	defer func() {
		part := dst + ".part"
		if fi, err := os.Lstat(part); !done && err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
			// Nothing was downloaded: nothing is left to resume.
			os.Remove(part)
			os.Remove(dst + ".part.json")
		}
		if _, err := os.Lstat(part); done || errors.Is(err, fs.ErrNotExist) {
			os.Remove(lockPath) // fails on Windows, where the file is open: it stays
		}
		lock.Release()
	}()
	if ok, _ := matches(dst, pin); ok {
		done = true
		return nil
	}
	if local != "" {
		return copyLocal(shown, local, dst, pin, o.Logger)
	}
	d := &download{url: url, shown: shown, dst: dst, pin: pin, o: o}
	if err := d.open(); err != nil {
		return err
	}
	defer d.part.Close()
	defer func() {
		// What was downloaded before an error is counted for the next run.
		if d.sync != nil {
			d.sync.stop()
		}
	}()
	if err := d.pass(ctx); err != nil {
		return err
	}
	if d.verified() {
		err := d.finish()
		done = err == nil
		return err
	}
	d.o.Logger.Warn("the downloaded file misses its pin; fetching every chunk twice", "url", shown)
	if err := d.consensus(ctx); err != nil {
		return err
	}
	if !d.verified() {
		// Fetched twice alike and still wrong: nothing of it is worth
		// resuming.
		if d.sync != nil {
			d.sync.stop()
			d.sync = nil
		}
		d.part.Close()
		os.Remove(d.partPath())
		os.Remove(d.statePath())
		return fmt.Errorf("fetch %s: %w: fetched twice it gives sha256 %x (%d bytes) both times, the pin says %s: the pin or the upstream file is wrong; nothing was installed",
			shown, ErrPinMismatch, d.h.Sum(nil), d.st.Committed, pin)
	}
	err = d.finish()
	done = err == nil
	return err
}

// String is the pin as messages show it: the digest, and the size when
// one is pinned.
func (p Pin) String() string {
	if p.Size > 0 {
		return fmt.Sprintf("%s (%d bytes)", p.SHA256, p.Size)
	}
	return p.SHA256
}

// check refuses a pin no download could match.
func (p Pin) check() error {
	if len(p.SHA256) != 64 {
		return fmt.Errorf("the pinned sha256 %q is not 64 hex digits", term.Sanitize(p.SHA256))
	}
	if _, err := hex.DecodeString(p.SHA256); err != nil {
		return fmt.Errorf("the pinned sha256 %q is not hex", term.Sanitize(p.SHA256))
	}
	if p.Size < 0 {
		return fmt.Errorf("the pinned size %d is negative (give the size in bytes, or 0 when it is unknown)", p.Size)
	}
	return nil
}

// ShowURL returns raw as a message or a log may show it: with the
// password of its user information redacted and its control
// characters escaped.
func ShowURL(raw string) string {
	return term.Sanitize(redacted(raw))
}

// redacted returns raw with the password of its user information
// redacted.
func redacted(raw string) string {
	if u, err := neturl.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	return raw
}

// unwrapPath returns the innermost error of a chain that ends with a
// *fs.PathError (whose path the caller names already), err otherwise.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// source checks raw before anything is downloaded: an http:// or
// https:// URL with a host and a valid port (local is ""), or a local
// file, named by a file:// URL or a path (local is its path). Anything
// else is an error no retry could mend.
func source(raw string) (local string, err error) {
	shown := redacted(raw) // quoted with %q, which escapes control characters
	u, perr := neturl.Parse(raw)
	lower := strings.ToLower(raw)
	switch {
	case perr != nil && (strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://")):
		var ue *neturl.Error
		if errors.As(perr, &ue) {
			perr = ue.Err // it names the URL
		}
		return "", fmt.Errorf("fetch %q: not a valid URL: %s", shown, term.Sanitize(strings.TrimPrefix(perr.Error(), "net/url: ")))
	case perr == nil && (u.Scheme == "http" || u.Scheme == "https"):
		if u.Host == "" {
			return "", fmt.Errorf("fetch %q: the URL has no host (want http://HOST/PATH)", shown)
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return "", fmt.Errorf("fetch %q: the port %s is out of range (want 1 to 65535)", shown, p)
			}
		}
		return "", nil
	case perr == nil && u.Scheme == "file":
		if u.Host != "" && u.Host != "localhost" {
			return "", fmt.Errorf("fetch %q: a file:// URL must name a file on this machine (file:///PATH)", shown)
		}
		local = u.Path
		if len(local) > 2 && local[0] == '/' && local[2] == ':' && filepath.Separator == '\\' {
			local = local[1:] // file:///C:/x is C:/x on Windows
		}
		local = filepath.FromSlash(local)
	case perr == nil && len(u.Scheme) > 1:
		return "", fmt.Errorf("fetch %q: %s:// is not supported: give an http://, https:// or file:// URL, or the path of a local file", shown, term.Sanitize(u.Scheme))
	default:
		// No scheme (or a Windows drive letter): a path.
		local = raw
	}
	fi, err := os.Stat(local)
	switch {
	case errors.Is(err, fs.ErrNotExist) && (perr != nil || u.Scheme != "file"):
		return "", fmt.Errorf("fetch %q: neither a URL (it would begin with http:// or https://) nor a file here", shown)
	case err != nil:
		return "", fmt.Errorf("fetch %q: %w", shown, unwrapPath(err))
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("fetch %q: %s is not a regular file", shown, term.Sanitize(local))
	}
	return local, nil
}

// checkDestination refuses, before anything is downloaded, a dst that
// is a folder or whose folder does not exist, and a dst.part that is
// not a file.
func checkDestination(shown, dst string) error {
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return fmt.Errorf("fetch %s: %s is a folder: name the file to write", shown, term.Sanitize(dst))
	}
	if fi, err := os.Lstat(dst + ".part"); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("fetch %s: %s is in the way of the download, and not a download left to resume: move it away or remove it", shown, term.Sanitize(dst+".part"))
	}
	dir := filepath.Dir(dst)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("fetch %s: the folder %s does not exist: create it first", shown, term.Sanitize(dir))
	case err != nil:
		return fmt.Errorf("fetch %s: the folder %s: %w", shown, term.Sanitize(dir), unwrapPath(err))
	case !fi.IsDir():
		return fmt.Errorf("fetch %s: %s is not a folder", shown, term.Sanitize(dir))
	}
	return nil
}

// copyLocal puts the local file src at dst, verified against pin the
// same way as a download: through dst.part, renamed into place only if
// it matches.
func copyLocal(url, src, dst string, pin Pin, log *slog.Logger) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	if pin.Size > 0 && fi.Size() != pin.Size {
		return fmt.Errorf("fetch %s: %w: %s is %d bytes, the pin says %d; nothing was installed", url, ErrPinMismatch, term.Sanitize(src), fi.Size(), pin.Size)
	}
	part := dst + ".part"
	out, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(part)
		return fmt.Errorf("fetch %s: copying to %s: %w", url, term.Sanitize(part), unwrapPath(err))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != pin.SHA256 || (pin.Size > 0 && n != pin.Size) {
		os.Remove(part)
		return fmt.Errorf("fetch %s: %w: %s has sha256 %s (%d bytes), the pin says %s; nothing was installed", url, ErrPinMismatch, term.Sanitize(src), got, n, pin)
	}
	if err := os.Rename(part, dst); err != nil {
		os.Remove(part)
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	os.Remove(dst + ".part.json")
	atomicfile.SyncDir(filepath.Dir(dst))
	log.Info("copied and verified", "file", src, "to", dst, "bytes", n)
	return nil
}

// matches reports whether the file at p has the pinned size and digest.
func matches(p string, pin Pin) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || (pin.Size > 0 && fi.Size() != pin.Size) {
		return false, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == strings.ToLower(pin.SHA256), nil
}

func (d *download) statePath() string { return d.dst + ".part.json" }
func (d *download) partPath() string  { return d.dst + ".part" }

// open opens dst.part and the state, keeping what a previous run of the
// same download committed.
func (d *download) open() error {
	// The state names the URL without its password: it is a file others
	// may read, and runtime status shows it.
	url := redacted(d.url)
	fresh := state{URL: url, SHA256: d.pin.SHA256, Size: d.pin.Size}
	d.st = fresh
	b, err := os.ReadFile(d.statePath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("fetch %s: reading the download's state: %w (delete %s to start over)", d.shown, err, d.statePath())
	default:
		var st state
		if err := json.Unmarshal(b, &st); err != nil || !st.sane() {
			// Damaged: what it counts cannot be trusted, so nothing of
			// dst.part is kept.
			d.o.Logger.Warn("the download's state is damaged; discarding it and starting the download over", "file", d.statePath(), "err", err)
			d.st.Committed = -1
		} else if st.URL == url && st.SHA256 == d.pin.SHA256 && st.Size == d.pin.Size {
			d.st = st
		}
	}
	f, err := os.OpenFile(d.partPath(), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	d.part = f
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	if d.st.Committed < 0 {
		d.st = fresh
		if err := d.rewind(0); err != nil {
			return err
		}
		return d.writeState()
	}
	if d.st.Committed > fi.Size() {
		d.st.Committed = 0
	}
	return d.rewind(d.st.Committed)
}

// sane reports whether the counts of a state read from disk can be
// those of a download.
func (st *state) sane() bool {
	return st.Committed >= 0 && st.Total >= 0 && st.Size >= 0 &&
		(st.Total == 0 || st.Committed <= st.Total) &&
		(st.Total == 0 || st.Size == 0 || st.Total == st.Size) &&
		(st.Size == 0 || st.Committed <= st.Size)
}

// rewind truncates dst.part to n bytes and hashes them again.
func (d *download) rewind(n int64) error {
	if d.sync != nil {
		// Nothing counted may be cut from under a pending sync.
		d.sync.stop()
		d.sync = nil
	}
	if err := d.part.Truncate(n); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	d.h = sha256.New()
	if _, err := d.part.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	if _, err := io.CopyN(d.h, d.part, n); err != nil {
		return fmt.Errorf("fetch %s: hashing the part already downloaded: %w", d.shown, err)
	}
	cut := n < d.st.Committed
	d.st.Committed = n
	if cut {
		// The state on disk counts more than there is now: replace it at
		// once, so that a crash cannot resume past the cut.
		if err := d.writeState(); err != nil {
			return err
		}
	}
	return nil
}

// writeState writes the state now (the syncer is stopped).
func (d *download) writeState() error {
	b, _ := json.Marshal(d.st)
	tmp := d.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	if err := os.Rename(tmp, d.statePath()); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	return nil
}

// commit hands what was appended to the syncer, which makes it durable
// and only then records it in the state: the network and the disk
// work at once, and the state never counts a byte not on disk.
func (d *download) commit() error {
	if d.sync == nil {
		d.sync = newSyncer(d.part, d.statePath())
	}
	if err := d.sync.submit(d.st); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	if d.o.Progress != nil {
		d.o.Progress(Progress{URL: d.shown, Done: d.st.Committed, Total: d.total()})
	}
	return nil
}

func (d *download) total() int64 {
	if d.pin.Size > 0 {
		return d.pin.Size
	}
	return d.st.Total
}

func (d *download) verified() bool {
	if d.pin.Size > 0 && d.st.Committed != d.pin.Size {
		return false
	}
	return hex.EncodeToString(d.h.Sum(nil)) == d.pin.SHA256
}

// finish puts the verified file in place.
func (d *download) finish() error {
	if d.sync != nil {
		d.sync.stop()
		d.sync = nil
	}
	if err := d.part.Sync(); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	if err := d.part.Close(); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	// What is on disk, not what went through the hash, is what goes in
	// place: read it once more (it is in the page cache).
	if ok, err := matches(d.partPath(), d.pin); !ok {
		os.Remove(d.partPath())
		os.Remove(d.statePath())
		return fmt.Errorf("fetch %s: %w: %s on disk does not match what was downloaded (%v); it was removed, download it again", d.shown, ErrPinMismatch, term.Sanitize(d.partPath()), err)
	}
	if err := os.Rename(d.partPath(), d.dst); err != nil {
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	}
	os.Remove(d.statePath())
	atomicfile.SyncDir(filepath.Dir(d.dst))
	d.o.Logger.Info("downloaded and verified", "url", d.shown, "file", d.dst, "bytes", d.st.Committed)
	return nil
}

// pass downloads from the committed offset to the end: the first chunk
// alone (it tells whether the server serves ranges, and the file's size
// and validator), the rest several at once where it does.
func (d *download) pass(ctx context.Context) error {
	for first := true; ; first = false {
		if !first && d.o.Parallel > 1 && d.total() > 0 && d.st.validator() != "" {
			err := d.parallel(ctx)
			if !errors.Is(err, errChanged) {
				return err
			}
			// The file changed: from zero, one chunk at a time.
			d.o.Logger.Warn("the file changed on the server; starting over", "url", d.shown)
			if err := d.rewind(0); err != nil {
				return err
			}
			d.st.ETag, d.st.LastModified, d.st.Total = "", "", 0
			first = true
		}
		total := d.total()
		if total > 0 && d.st.Committed >= total {
			return nil
		}
		end := d.st.Committed + d.o.Chunk - 1
		if total > 0 && end > total-1 {
			end = total - 1
		}
		done, err := d.chunkWithRetries(ctx, d.st.Committed, end)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// chunkWithRetries fetches bytes start..end and appends them; done
// reports that the file is complete (a whole-file answer, or a 416 on a
// complete file).
func (d *download) chunkWithRetries(ctx context.Context, start, end int64) (done bool, err error) {
	wait := d.o.Backoff
	stalls := 0
	for attempt := 1; ; attempt++ {
		done, err := d.chunk(ctx, start, end)
		if err == nil {
			return done, nil
		}
		if !transient(err, &stalls) || ctx.Err() != nil || attempt >= d.o.Attempts {
			return false, d.failed(err, start, attempt)
		}
		d.o.Logger.Warn("chunk failed; retrying", "url", d.shown, "range", fmt.Sprintf("%d-%d", start, end), "attempt", attempt, "err", err)
		if d.st.Committed < start {
			// The answer reset the download (a changed file, a whole-file
			// answer cut short): go on from where it now stands.
			d.restarts++
			if d.restarts > d.o.Attempts {
				return false, fmt.Errorf("fetch %s: started over %d times: %w", d.shown, d.restarts, err)
			}
			return false, nil
		}
		if rerr := d.rewind(start); rerr != nil {
			return false, rerr
		}
		if err := d.pause(ctx, &wait); err != nil {
			return false, err
		}
	}
}

// failed is the error of a chunk from start that failed for the last
// time, after attempts attempts, with err.
func (d *download) failed(err error, start int64, attempts int) error {
	var perm *permanentError
	switch {
	case attempts == 1 || errors.As(err, &perm):
		return fmt.Errorf("fetch %s: %w", d.shown, err)
	case start == 0:
		return fmt.Errorf("fetch %s: after %d attempts: %w", d.shown, attempts, err)
	}
	return fmt.Errorf("fetch %s: at byte %d, after %d attempts: %w", d.shown, start, attempts, err)
}

// maxRedirects is how many redirects a request may follow.
const maxRedirects = 10

// checkRedirect follows a redirect to an http:// or https:// URL, at
// most maxRedirects in a row; anything else is a permanent error.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return &permanentError{fmt.Errorf("the server redirected to %s, which is not an http:// or https:// URL", ShowURL(req.URL.String()))}
	}
	if len(via) >= maxRedirects {
		return &permanentError{fmt.Errorf("the server redirected more than %d times in a row (last to %s)", maxRedirects, ShowURL(req.URL.String()))}
	}
	return nil
}

// permanentError is an answer no retry can change (404, an HTML page).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

var contentRange = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^bytes (\d+)-(\d+)/(\d+|\*)$`) })

// get asks for bytes start..end with Range, Accept-Encoding: identity
// and, when ifRange is set, If-Range. The body it returns cancels the
// request when it stays silent for the idle timeout; done releases it.
// An encoded answer is an error.
func (d *download) get(ctx context.Context, start, end int64, ifRange string) (resp *http.Response, body io.Reader, done func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		cancel()
		return nil, nil, nil, &permanentError{err}
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end))
	req.Header.Set("Accept-Encoding", "identity")
	if ifRange != "" {
		req.Header.Set("If-Range", ifRange)
	}
	st := &stall{host: req.URL.Host, d: d.o.Idle}
	idle := time.AfterFunc(d.o.Idle, func() { st.fired.Store(true); cancel() })
	resp, err = d.o.Client.Do(req)
	if err != nil {
		idle.Stop()
		cancel()
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err // it names the URL, which the error of File names already
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			err = fmt.Errorf("nothing listens at %s (the connection was refused): is the server running, and is the port right?", term.Sanitize(hostPort(req.URL)))
		}
		return nil, nil, nil, st.explain(err)
	}
	done = func() { resp.Body.Close(); idle.Stop(); cancel() }
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		done()
		return nil, nil, nil, &permanentError{fmt.Errorf("the server sent the file %s-encoded although identity was asked", ce)}
	}
	return resp, &idleReader{r: resp.Body, t: idle, d: d.o.Idle, stall: st}, done, nil
}

// hostPort is u's host and port, the scheme's default port when u
// names none.
func hostPort(u *neturl.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// stall is the idle timeout of one request.
type stall struct {
	host  string
	d     time.Duration
	fired atomic.Bool
}

// explain returns a *stallError for err when the idle timeout cut the
// request, err otherwise.
func (s *stall) explain(err error) error {
	if err != nil && s.fired.Load() {
		return &stallError{host: s.host, d: s.d}
	}
	return err
}

// stallError is a server that sent nothing for the idle timeout. It is
// retried, but only [maxStalls] times in a row for a chunk: a server
// that stalls again is taken to be down.
type stallError struct {
	host string
	d    time.Duration
}

func (e *stallError) Error() string {
	return fmt.Sprintf("no data for %s s from %s", strconv.FormatFloat(e.d.Seconds(), 'f', -1, 64), e.host)
}

// maxStalls is how many attempts in a row of one chunk may stall before
// the download fails (the idle timeout each).
const maxStalls = 3

// transient reports whether another attempt may succeed after err: not
// for a [permanentError], nor a full disk (which the seconds between
// attempts do not free; the caller tries again later, resuming from
// what was committed), nor after maxStalls stalls in a row.
func transient(err error, stalls *int) bool {
	var perm *permanentError
	if errors.As(err, &perm) || diskFull(err) {
		return false
	}
	var se *stallError
	if errors.As(err, &se) {
		*stalls++
		return *stalls < maxStalls
	}
	*stalls = 0
	return true
}

// statusError classifies an HTTP status that is not the file: a 4xx
// but 408 and 429 is permanent (the URL is wrong, or not allowed),
// anything else (5xx, a timeout, a rate limit) may pass.
func statusError(resp *http.Response) error {
	err := fmt.Errorf("the server answered %s", resp.Status)
	if c := resp.StatusCode; c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooManyRequests {
		return &permanentError{err}
	}
	return err
}

// pause waits before the next attempt (wait, with jitter) and doubles
// wait up to 5 s.
func (d *download) pause(ctx context.Context, wait *time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(float64(*wait) * (0.75 + rand.Float64()*0.5))):
	}
	*wait = min(2**wait, 5*time.Second)
	return nil
}

// chunk makes one request for start..end.
func (d *download) chunk(ctx context.Context, start, end int64) (bool, error) {
	ifRange := ""
	if start > 0 {
		ifRange = d.st.validator()
	}
	resp, body, done, err := d.get(ctx, start, end, ifRange)
	if err != nil {
		return false, err
	}
	defer done()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		m := contentRange().FindStringSubmatch(resp.Header.Get("Content-Range"))
		if m == nil || m[1] != strconv.FormatInt(start, 10) {
			return false, fmt.Errorf("the server answered Content-Range %q to bytes=%d-%d", resp.Header.Get("Content-Range"), start, end)
		}
		gotEnd, _ := strconv.ParseInt(m[2], 10, 64)
		total, _ := strconv.ParseInt(m[3], 10, 64)
		if m[3] == "*" {
			return false, fmt.Errorf("the server answered Content-Range %q, without the file's size", m[0])
		}
		if d.pin.Size > 0 && total != d.pin.Size {
			return false, &permanentError{fmt.Errorf("%w: the server says the file is %d bytes, the pin says %d: the pin or the URL is wrong; nothing was installed", ErrPinMismatch, total, d.pin.Size)}
		}
		if d.pin.Size == 0 && d.o.MaxSize > 0 && total > d.o.MaxSize {
			return false, &permanentError{tooLarge(total, d.o.MaxSize)}
		}
		if et := resp.Header.Get("ETag"); d.st.ETag != "" && et != "" && et != d.st.ETag && start > 0 {
			// A server that ignored If-Range: another version.
			d.restart(resp)
			return false, errors.New("the file changed on the server (another ETag)")
		}
		if d.st.Total != 0 && total != d.st.Total {
			// The file changed size under the same validator: start over.
			d.o.Logger.Warn("the file changed on the server; starting over", "url", d.shown)
			d.restart(resp)
			return false, errors.New("the file changed on the server")
		}
		want := end
		if want > total-1 {
			want = total - 1
		}
		if gotEnd != want {
			return false, fmt.Errorf("the server answered Content-Range %q to bytes=%d-%d", resp.Header.Get("Content-Range"), start, end)
		}
		if start == 0 || d.st.validator() == "" {
			d.st.ETag, d.st.LastModified = resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
		}
		d.st.Total = total
		n, err := d.appendBody(body, want-start+1)
		if err != nil {
			return false, err
		}
		if n != want-start+1 {
			return false, fmt.Errorf("a body of %d bytes for a %d-byte range", n, want-start+1)
		}
		d.st.Committed = want + 1
		return false, d.commit()
	case http.StatusOK:
		// No Range support, or the file changed (If-Range): the whole
		// file, from zero, never appended to what was there.
		if start > 0 {
			d.o.Logger.Warn("the server sent the whole file; starting over from zero", "url", d.shown, "had", start)
		}
		if err := d.rewind(0); err != nil {
			return false, err
		}
		d.st.ETag, d.st.LastModified = resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
		if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "text/html") {
			return false, &permanentError{fmt.Errorf("the server sent an HTML page (%s), not the file", ct)}
		}
		if d.pin.Size > 0 && resp.ContentLength >= 0 && resp.ContentLength != d.pin.Size {
			return false, &permanentError{fmt.Errorf("%w: the server says the file is %d bytes, the pin says %d: the pin or the URL is wrong; nothing was installed", ErrPinMismatch, resp.ContentLength, d.pin.Size)}
		}
		limit := d.pin.Size
		if limit == 0 && d.o.MaxSize > 0 {
			if resp.ContentLength > d.o.MaxSize {
				return false, &permanentError{tooLarge(resp.ContentLength, d.o.MaxSize)}
			}
			limit = d.o.MaxSize
		}
		if limit == 0 {
			limit = 1 << 40
		}
		n, err := d.appendBody(body, limit+1)
		if err != nil {
			d.rewind(0)
			return false, err
		}
		if d.pin.Size == 0 && d.o.MaxSize > 0 && n > d.o.MaxSize {
			d.rewind(0)
			return false, &permanentError{tooLarge(n, d.o.MaxSize)}
		}
		if d.pin.Size > 0 && n != d.pin.Size {
			d.rewind(0)
			return false, fmt.Errorf("the whole-file answer was %d bytes, the pin says %d", n, d.pin.Size)
		}
		if resp.ContentLength >= 0 && n != resp.ContentLength {
			d.rewind(0)
			return false, fmt.Errorf("the whole-file answer was %d bytes, its Content-Length said %d", n, resp.ContentLength)
		}
		d.st.Committed, d.st.Total = n, n
		return true, d.commit()
	case http.StatusRequestedRangeNotSatisfiable:
		if d.total() > 0 && start >= d.total() {
			return true, nil
		}
		if m := regexp.MustCompile(`^bytes \*/(\d+)$`).FindStringSubmatch(resp.Header.Get("Content-Range")); m != nil {
			if n, _ := strconv.ParseInt(m[1], 10, 64); n == start && start > 0 {
				d.st.Total = n
				return true, nil
			}
		}
		d.o.Logger.Warn("the server cannot serve the range asked; starting over", "url", d.shown, "from", start)
		d.rewind(0)
		return false, errors.New("416 for a range inside the file")
	}
	return false, statusError(resp)
}

// tooLarge is the error of a file larger than Options.MaxSize.
func tooLarge(size, max int64) error {
	return fmt.Errorf("the server says the file is %d bytes, more than the %d this download accepts: refused", size, max)
}

// restart forgets everything: the file changed upstream.
func (d *download) restart(resp *http.Response) {
	d.rewind(0)
	d.st.ETag, d.st.LastModified, d.st.Total = "", "", 0
}

// appendBody writes at most limit bytes of r at the end of dst.part and
// into the hash.
func (d *download) appendBody(r io.Reader, limit int64) (int64, error) {
	if _, err := d.part.Seek(d.st.Committed, io.SeekStart); err != nil {
		return 0, err
	}
	n, err := io.CopyBuffer(io.MultiWriter(d.part, d.h), io.LimitReader(r, limit), make([]byte, 1<<20))
	if err != nil {
		return n, fmt.Errorf("after %d bytes: %w", n, err)
	}
	if n == limit && limit > 0 {
		// More than asked for: read one byte past to be sure.
		var one [1]byte
		if m, _ := r.Read(one[:]); m > 0 {
			return n + 1, nil
		}
	}
	return n, nil
}

// idleReader cancels the request when a read waits longer than d, and
// then says so (a *stallError) instead of "context canceled".
type idleReader struct {
	r     io.Reader
	t     *time.Timer
	d     time.Duration
	stall *stall
}

func (i *idleReader) Read(p []byte) (int, error) {
	i.t.Reset(i.d)
	n, err := i.r.Read(p)
	i.t.Reset(i.d)
	if err != nil && err != io.EOF {
		err = i.stall.explain(err)
	}
	return n, err
}

// consensus downloads the file again from zero, every chunk twice: a
// chunk counts only when both copies agree (a flaky mirror or a bad
// link cannot slip a wrong byte in unnoticed). Whether the result
// matches the pin is checked by the caller.
func (d *download) consensus(ctx context.Context) error {
	if err := d.rewind(0); err != nil {
		return err
	}
	total := d.total()
	if total == 0 {
		return fmt.Errorf("fetch %s: the file's size is unknown, so it cannot be fetched again by chunks", d.shown)
	}
	for start := int64(0); start < total; {
		end := min(start+d.o.Chunk-1, total-1)
		var agreed []byte
		var last [32]byte
		for attempt := 1; agreed == nil; attempt++ {
			b, err := d.fetchRange(ctx, start, end, "")
			var perm *permanentError
			if errors.As(err, &perm) {
				return fmt.Errorf("fetch %s: bytes %d-%d: %w", d.shown, start, end, err)
			}
			if err == nil {
				sum := sha256.Sum256(b)
				if attempt > 1 && sum == last {
					agreed = b
					break
				}
				last = sum
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if attempt >= 2*d.o.Attempts {
				return fmt.Errorf("fetch %s: bytes %d-%d: no two copies agreed in %d attempts (last error: %v)", d.shown, start, end, attempt, err)
			}
		}
		if _, err := d.part.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := d.part.Write(agreed); err != nil {
			return fmt.Errorf("fetch %s: %w", d.shown, err)
		}
		d.h.Write(agreed)
		d.st.Committed = end + 1
		if err := d.commit(); err != nil {
			return err
		}
		if d.o.Progress != nil {
			d.o.Progress(Progress{URL: d.shown, Done: d.st.Committed, Total: total, Pass: 2})
		}
		start = end + 1
	}
	return nil
}

// errChanged says the server's file is no longer the one the download
// started on (If-Range answered with the whole file).
var errChanged = errors.New("the file changed on the server")

// parallel fetches the rest of the file, Parallel chunks at a time into
// memory, and appends, hashes and commits them in order.
func (d *download) parallel(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	total := d.total()
	type result struct {
		b   []byte
		err error
	}
	next := d.st.Committed
	var window []chan result
	launch := func() {
		if next >= total {
			return
		}
		start, end := next, min(next+d.o.Chunk-1, total-1)
		next = end + 1
		ch := make(chan result, 1)
		window = append(window, ch)
		go func() {
			b, err := d.rangeWithRetries(ctx, start, end)
			ch <- result{b, err}
		}()
	}
	for i := 0; i < d.o.Parallel; i++ {
		launch()
	}
	for len(window) > 0 {
		r := <-window[0]
		window = window[1:]
		if r.err != nil {
			return r.err
		}
		if _, err := d.part.Seek(d.st.Committed, io.SeekStart); err != nil {
			return err
		}
		if _, err := d.part.Write(r.b); err != nil {
			return fmt.Errorf("fetch %s: %w", d.shown, err)
		}
		d.h.Write(r.b)
		d.st.Committed += int64(len(r.b))
		if err := d.commit(); err != nil {
			return err
		}
		launch()
	}
	return nil
}

// rangeWithRetries fetches start..end into memory with the validator in
// If-Range, retrying as chunkWithRetries does.
func (d *download) rangeWithRetries(ctx context.Context, start, end int64) ([]byte, error) {
	wait := d.o.Backoff
	stalls := 0
	for attempt := 1; ; attempt++ {
		b, err := d.fetchRange(ctx, start, end, d.st.validator())
		if err == nil {
			return b, nil
		}
		if errors.Is(err, errChanged) || !transient(err, &stalls) || ctx.Err() != nil || attempt >= d.o.Attempts {
			if errors.Is(err, errChanged) {
				return nil, err
			}
			return nil, d.failed(err, start, attempt)
		}
		d.o.Logger.Warn("chunk failed; retrying", "url", d.shown, "range", fmt.Sprintf("%d-%d", start, end), "attempt", attempt, "err", err)
		if err := d.pause(ctx, &wait); err != nil {
			return nil, err
		}
	}
}

// fetchRange fetches start..end into memory: a 206 with exactly that
// Content-Range and length. With ifRange set (the parallel pass), a 200
// means the file changed (errChanged); without it (the agreement pass,
// whose validator may be what is wrong), a 200 is taken only when the
// range asked is the whole file.
func (d *download) fetchRange(ctx context.Context, start, end int64, ifRange string) ([]byte, error) {
	resp, body, done, err := d.get(ctx, start, end, ifRange)
	if err != nil {
		return nil, err
	}
	defer done()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		if want := fmt.Sprintf("bytes %d-%d/%d", start, end, d.total()); resp.Header.Get("Content-Range") != want {
			return nil, fmt.Errorf("the server answered Content-Range %q to bytes=%d-%d", resp.Header.Get("Content-Range"), start, end)
		}
	case http.StatusOK:
		if ifRange != "" {
			return nil, errChanged
		}
		if start != 0 || end != d.total()-1 {
			return nil, fmt.Errorf("the server answered %s to a range", resp.Status)
		}
	default:
		return nil, statusError(resp)
	}
	b := make([]byte, end-start+1)
	if n, err := io.ReadFull(body, b); err != nil {
		return nil, fmt.Errorf("a body of %d bytes for a %d-byte range: %w", n, len(b), err)
	}
	var one [1]byte
	if m, _ := body.Read(one[:]); m > 0 {
		return nil, fmt.Errorf("a body longer than the %d-byte range", len(b))
	}
	return b, nil
}

// syncer fsyncs dst.part in the background and then writes the state it
// was given. One state is written at a time, and a new one waits until
// the one before is on disk: the next chunk downloads meanwhile, but a
// slow disk cannot let the recorded state fall further behind, so a
// crash loses at most the chunk being recorded and the one in flight.
type syncer struct {
	f       *os.File
	path    string
	mu      sync.Mutex
	written *sync.Cond // signalled when a flush ends
	busy    bool       // a state is being written
	pending *state
	err     error
	kick    chan struct{}
	done    chan struct{}
}

func newSyncer(f *os.File, path string) *syncer {
	s := &syncer{f: f, path: path, kick: make(chan struct{}, 1), done: make(chan struct{})}
	s.written = sync.NewCond(&s.mu)
	go s.run()
	return s
}

// submit queues st (a copy), once the state before it is written, and
// reports an earlier failure, if any.
func (s *syncer) submit(st state) error {
	s.mu.Lock()
	for s.busy || s.pending != nil {
		s.written.Wait()
	}
	s.pending = &st
	err := s.err
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return err
}

func (s *syncer) run() {
	defer close(s.done)
	for range s.kick {
		s.flush()
	}
	s.flush()
}

func (s *syncer) flush() {
	s.mu.Lock()
	st := s.pending
	s.pending = nil
	s.busy = st != nil
	s.mu.Unlock()
	if st == nil {
		return
	}
	defer func() {
		s.mu.Lock()
		s.busy = false
		s.written.Broadcast()
		s.mu.Unlock()
	}()
	err := s.f.Sync()
	if err == nil {
		// Replaced by a rename, without a sync of its own: a state lost
		// to a power cut is an older one (or none), which only means
		// downloading more.
		b, _ := json.Marshal(st)
		tmp := s.path + ".tmp"
		if err = os.WriteFile(tmp, b, 0o644); err == nil {
			err = os.Rename(tmp, s.path)
		}
	}
	if err != nil {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}
}

// stop writes what is pending and ends the syncer.
func (s *syncer) stop() {
	close(s.kick)
	<-s.done
}
