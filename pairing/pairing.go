// Package pairing keeps the device's identity: its Ed25519 key and the
// state.json that pins the server it is paired with. Both live where the
// Metnos Rust client keeps them, the [layout.Layout]'s Key and State, and
// in the same format (docs/protocol.md §2.1, §2.4, §14), so metnos-agent
// picks up an existing pairing as it is, and the Rust client would pick
// up ours.
package pairing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/term"
)

// ErrNoKey is wrapped by the error of [LoadKey] when there is no
// device key yet (the file is missing, and is not a link).
var ErrNoKey = errors.New("pairing: no device key yet")

// LoadKey reads the device key from lay's Key: exactly the 32 raw bytes
// of an Ed25519 seed, in a file only its owner can read. It creates and
// changes nothing. A missing file is an error wrapping [ErrNoKey]; a
// link whose target is missing (a vault or drive not mounted), a key
// others can read, or a file of another size is another error, naming
// the file and what to do.
func LoadKey(lay layout.Layout) (ed25519.PrivateKey, error) {
	path := lay.Key()
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if target, lerr := os.Readlink(path); lerr == nil {
				return nil, fmt.Errorf("pairing: the device key %s is a link to %s, which does not exist (a vault or drive not mounted?): mount it, or restore the key there", path, target)
			}
			return nil, fmt.Errorf("%w: %s does not exist", ErrNoKey, path)
		}
		return nil, fmt.Errorf("pairing: reading the device key %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("pairing: the device key %s is not a file (%v): move it away", path, fi.Mode().Type())
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("pairing: the device key %s is readable by others (%v): chmod 600 it; if anyone else could have copied it, revoke this device on the server's Devices page, move the key away and pair again", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pairing: reading the device key %s: %w", path, err)
	}
	if len(b) != ed25519.SeedSize {
		return nil, fmt.Errorf("pairing: %s is %d bytes, want the %d raw bytes of an Ed25519 seed; it is not a Metnos device key (move it away to make a new key, and pair again)", path, len(b), ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(b), nil
}

// LoadOrCreateKey is [LoadKey], except that on a device that is not
// paired and has no key yet it makes one: a new Ed25519 seed, mode
// 0600, in lay's Key, creating the data folder (never a missing home
// folder, see [CheckHome]). It never writes through or over a link, nor
// over any file: on a paired device a missing key is an error naming
// the file and what to do, since a new key would not be the device the
// server knows.
func LoadOrCreateKey(lay layout.Layout) (ed25519.PrivateKey, error) {
	key, fresh, err := LoadOrNewKey(lay)
	if err != nil || !fresh {
		return key, err
	}
	if err := SaveNewKey(lay, key); err != nil {
		return nil, err
	}
	return key, nil
}

// LoadOrNewKey is [LoadOrCreateKey] without writing anything: a new
// key (fresh) is only in memory, for [SaveNewKey] to write once it is
// known to be wanted (register writes it once the server paired it).
func LoadOrNewKey(lay layout.Layout) (key ed25519.PrivateKey, fresh bool, err error) {
	key, err = LoadKey(lay)
	if !errors.Is(err, ErrNoKey) {
		return key, false, err
	}
	path := lay.Key()
	st, err := LoadState(lay)
	if err != nil {
		return nil, false, err
	}
	if st.Paired() {
		server := "its server"
		if st.ServerURL != nil && *st.ServerURL != "" {
			server = term.Sanitize(*st.ServerURL)
		}
		return nil, false, fmt.Errorf("pairing: the device key %s is missing, but this device is paired (device %s with %s): restore the key file from a backup (or mount where it lives), or run `metnos-agent unpair` and pair again as a new device", path, term.Sanitize(*st.DeviceID), server)
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, false, fmt.Errorf("pairing: making a device key: %w", err)
	}
	return ed25519.NewKeyFromSeed(seed), true, nil
}

// SaveNewKey writes key, made by [LoadOrNewKey], to lay's Key, mode
// 0600, creating the data folder; it never writes through or over a
// link or any file already there.
func SaveNewKey(lay layout.Layout, key ed25519.PrivateKey) error {
	if err := makeDataDir(lay); err != nil {
		return err
	}
	if err := createFile(lay.Key(), key.Seed()); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("pairing: the data folder %s is not writable by this user, so the device key cannot be written there: fix its owner or mode, or point %s at a folder of yours", lay.Data, layout.DataDirEnv)
		}
		return fmt.Errorf("pairing: writing the device key: %w", err)
	}
	return nil
}

// CheckPaired reports an error, creating and changing nothing, unless
// this device is paired and its key is usable: for a command that
// serves or asks the paired server, before it writes anything.
func CheckPaired(lay layout.Layout) error {
	st, err := LoadState(lay)
	if err != nil {
		return err
	}
	if !st.Paired() {
		return ErrNotPaired
	}
	_, _, err = LoadOrNewKey(lay)
	return err
}

// CheckDataWritable reports an error, leaving nothing behind, when this
// user could not write lay's data folder (or create it, when it does
// not exist yet): for register, before its token is spent on a pairing
// that could not be kept.
func CheckDataWritable(lay layout.Layout) error {
	dir := lay.Data
	for {
		fi, err := os.Stat(dir)
		if err == nil && fi.IsDir() {
			break
		}
		parent := filepath.Dir(dir)
		if err == nil || parent == dir {
			return nil // not a folder: the write says what is wrong
		}
		dir = parent
	}
	f, err := os.CreateTemp(dir, ".metnos-write-test*")
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			what := "the data folder " + lay.Data
			if dir != lay.Data {
				what = fmt.Sprintf("the folder %s, where the data folder %s would be made,", dir, lay.Data)
			}
			return fmt.Errorf("pairing: %s is not writable by this user: fix its owner or mode, or point %s at a folder of yours", what, layout.DataDirEnv)
		}
		return nil
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// ErrNotPaired is the error of a command that needs a pairing on a
// device that has none.
var ErrNotPaired = errors.New("this device is not paired: run `metnos-agent register --server URL --token TOKEN` first")

// createFile writes data to the new file path, mode 0600, durably, and
// never over anything already there, a link included: through a
// temporary file, fsynced, then hard-linked to path, which fails if
// path exists in any form.
func createFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", tmp, err)
	}
	err = os.Link(tmp, path)
	if err != nil && !errors.Is(err, os.ErrExist) {
		// A file system without hard links (FAT, some FUSE): create the
		// file in place, exclusively, which refuses a link as well.
		err = createExcl(path, data)
	}
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s appeared while the key was being made (another agent?): %w", path, err)
	}
	if err != nil {
		return err
	}
	atomicfile.SyncDir(filepath.Dir(path))
	return nil
}

// createExcl writes data to the new file path, mode 0600, failing if
// anything is there already (O_EXCL does not follow a link).
func createExcl(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// CheckHome reports an error when lay's data or cache folder lies under
// a home folder that does not exist: a command that writes must not
// create the user's home folder (a wrong $HOME, a home not mounted yet).
func CheckHome(lay layout.Layout) error {
	if lay.Home == "" {
		return nil
	}
	for _, d := range []string{lay.Data, lay.Cache} {
		if d == "" || !fspath.Within(d, lay.Home) {
			continue
		}
		if _, err := os.Stat(lay.Home); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("the home folder %s does not exist, and metnos-agent does not create it: set $HOME to your home folder, or create it (or put the agent's folders elsewhere with %s and %s)", lay.Home, layout.DataDirEnv, layout.CacheDirEnv)
		}
		return nil
	}
	return nil
}

// makeDataDir creates lay's data folder, mode 0700, unless it lies
// under a home folder that does not exist.
func makeDataDir(lay layout.Layout) error {
	if err := CheckHome(lay); err != nil {
		return fmt.Errorf("pairing: %w", err)
	}
	if err := os.MkdirAll(lay.Data, 0o700); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("pairing: the data folder %s cannot be created by this user: fix the owner or mode of the folder above it, or point %s at a folder of yours", lay.Data, layout.DataDirEnv)
		}
		return fmt.Errorf("pairing: creating the data folder: %w", err)
	}
	return nil
}

// State is state.json. Every field is optional; the device is paired
// when DeviceID is set.
type State struct {
	DeviceID   *string `json:"device_id"`
	DeviceName *string `json:"device_name"`
	ServerURL  *string `json:"server_url"`
	// Fingerprint is the server's fingerprint of this device: SHA-256
	// of its public key, lower-case hex (see
	// [github.com/metnos/agent/wire.ServerFingerprint]).
	Fingerprint *string `json:"fingerprint"`
	PairedAt    *string `json:"paired_at"`
	// ServerPublicKey is the pinned server key, base64url raw 32 bytes.
	ServerPublicKey *string `json:"server_public_key"`
}

// Paired reports whether the device is paired.
func (s State) Paired() bool { return s.DeviceID != nil && *s.DeviceID != "" }

// ServerKey decodes the pinned server key.
func (s State) ServerKey() (ed25519.PublicKey, error) {
	if s.ServerPublicKey == nil || *s.ServerPublicKey == "" {
		return nil, errors.New("pairing: no server key is pinned (pair again with a server that has one)")
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(*s.ServerPublicKey, "="))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("pairing: the pinned server key %q is not 32 bytes of base64url; pair again", *s.ServerPublicKey)
	}
	return ed25519.PublicKey(b), nil
}

// LoadState reads lay's State, state.json; a missing file is the empty,
// unpaired State. A link whose target is missing (a vault or drive not
// mounted) is an error naming both, not "not paired"; a file that is not
// a device state is an error naming it and what to do.
func LoadState(lay layout.Layout) (State, error) {
	path := lay.State()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if target, lerr := os.Readlink(path); lerr == nil {
			return State{}, fmt.Errorf("pairing: the pairing file %s is a link to %s, which does not exist (a vault or drive not mounted?): mount it, or restore the file there", path, term.Sanitize(target))
		}
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("pairing: reading the pairing file: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("pairing: the pairing file %s is damaged (%s): restore it, or run `metnos-agent unpair` and pair again", path, damage(b, err))
	}
	return s, nil
}

// damage says in a few words what is wrong with a state.json that did
// not decode.
func damage(b []byte, err error) string {
	var te *json.UnmarshalTypeError
	switch {
	case len(bytes.TrimSpace(b)) == 0:
		return "it is empty"
	case !json.Valid(b):
		return "it is not JSON"
	case errors.As(err, &te) && te.Field != "":
		return fmt.Sprintf("its %s is a JSON %s, not a string", te.Field, te.Value)
	case errors.As(err, &te):
		return fmt.Sprintf("it is a JSON %s, not an object", te.Value)
	}
	return "it is not a device state"
}

// SaveState writes lay's State, state.json, as the Rust client does:
// pretty JSON (two-space indent) through state.json.tmp and a rename.
func SaveState(lay layout.Layout, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("pairing: %w", err)
	}
	path := lay.State()
	if err := makeDataDir(lay); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("pairing: %s is a link; metnos-agent writes neither through nor over one: replace it with the file it points to", path)
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("pairing: writing the device state: %w", err)
	}
	return nil
}

// LocalFingerprint is what whoami calls the device key's fingerprint:
// the lower-case hex of the raw public key (not a hash, docs/protocol.md §2.1).
func LocalFingerprint(pub ed25519.PublicKey) string { return hex.EncodeToString(pub) }

// CheckServerURL reports whether u can be a Metnos server's URL, before
// anything is written or sent: an absolute http or https URL with a
// host, no user name or password, no query and no fragment (a path is
// kept: a server may live under one). The error is one sentence that
// says what is wrong and what is expected.
func CheckServerURL(u string) error {
	const want = "want http:// or https://, a host, and no ?query or #fragment, such as http://metnos.your-tailnet:8765"
	// Sanitize escapes what a terminal would act on, once; quoting
	// again would double its backslashes.
	q := `"` + term.Sanitize(u) + `"`
	if r, off, bad := term.FirstUnsafe(u); bad {
		return fmt.Errorf("the server URL %s holds %s at byte %d: %s", q, term.Describe(r), off, want)
	}
	p, err := url.Parse(u)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("the server URL %s is not a URL (%s): %s", q, strings.TrimPrefix(err.Error(), "net/url: "), want)
	}
	switch {
	case p.Scheme == "":
		return fmt.Errorf("the server URL %s has no scheme: %s", q, want)
	case !strings.EqualFold(p.Scheme, "http") && !strings.EqualFold(p.Scheme, "https"):
		return fmt.Errorf("the server URL %s does not start with http:// or https://: %s", q, want)
	case p.Opaque != "" || p.Host == "" || p.Hostname() == "":
		return fmt.Errorf("the server URL %s has no host: %s", q, want)
	case p.User != nil:
		return fmt.Errorf("the server URL %s holds a user name or password, which would end up in logs: %s", q, want)
	case p.RawQuery != "" || p.ForceQuery:
		return fmt.Errorf("the server URL %s has a query (?…): %s", q, want)
	case p.Fragment != "" || strings.Contains(u, "#"):
		return fmt.Errorf("the server URL %s has a fragment (#…): %s", q, want)
	}
	if port := p.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("the server URL %s has the port %s, not 1 to 65535: %s", q, port, want)
		}
	}
	return nil
}

// CheckServer reports whether the server URL a command would use is
// valid ([CheckServerURL]): given (a --server flag), else the paired
// one of state.json. It reads state.json only when given is "", and
// says nothing when there is neither (the command then says it is not
// paired).
func CheckServer(lay layout.Layout, given string) error {
	if given != "" {
		return CheckServerURL(given)
	}
	st, err := LoadState(lay)
	if err != nil || st.ServerURL == nil || !st.Paired() {
		return err
	}
	if err := CheckServerURL(*st.ServerURL); err != nil {
		return fmt.Errorf("%s: %w; pair again, or pass --server", lay.State(), err)
	}
	return nil
}
