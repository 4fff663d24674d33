//go:build windows

package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/windows"
)

// The calls of the AppContainer and low-integrity rungs. golang.org/x/sys
// has neither the profile functions of userenv.dll nor the security
// capabilities attribute; they are declared here, and each is looked up
// before it is called: an old Windows, or Wine, lacks them.

var (
	userenv                   = windows.NewLazySystemDLL("userenv.dll")
	procCreateProfile         = userenv.NewProc("CreateAppContainerProfile")
	procDeriveSID             = userenv.NewProc("DeriveAppContainerSidFromAppContainerName")
	procDeleteProfile         = userenv.NewProc("DeleteAppContainerProfile")
	advapi32                  = windows.NewLazySystemDLL("advapi32.dll")
	procCreateRestrictedToken = advapi32.NewProc("CreateRestrictedToken")
)

const (
	// procThreadAttributeSecurityCapabilities is
	// PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES.
	procThreadAttributeSecurityCapabilities = 0x00020009
	// hrAlreadyExists is HRESULT_FROM_WIN32(ERROR_ALREADY_EXISTS).
	hrAlreadyExists = 0x800700B7
	// tokenIsAppContainer and tokenAppContainerSid are the
	// TOKEN_INFORMATION_CLASS values TokenIsAppContainer and
	// TokenAppContainerSid.
	tokenIsAppContainer  = 29
	tokenAppContainerSid = 31
	// disableMaxPrivilege is CreateRestrictedToken's DISABLE_MAX_PRIVILEGE.
	disableMaxPrivilege = 0x1
	// sidLowIntegrity is the low mandatory level; sidInternetClient the
	// internetClient capability.
	sidLowIntegrity   = "S-1-16-4096"
	sidInternetClient = "S-1-15-3-1"
)

// defaultContainerName is the AppContainer profile of this device's
// executors when Options.ContainerName is "": one profile, created once,
// kept until uninstall. It is not the Rust client's (Metnos.Executor),
// so that neither removes the other's entries.
const defaultContainerName = "Metnos.Agent.Executor"

// securityCapabilities is SECURITY_CAPABILITIES.
type securityCapabilities struct {
	AppContainerSid *windows.SID
	Capabilities    *windows.SIDAndAttributes
	CapabilityCount uint32
	Reserved        uint32
}

// containerName is the profile o names.
func containerName(o Options) string {
	if o.ContainerName != "" {
		return o.ContainerName
	}
	return defaultContainerName
}

// missingProc says which of procs this Windows lacks ("" when none).
func missingProc(procs ...*windows.LazyProc) string {
	for _, p := range procs {
		if err := p.Find(); err != nil {
			return fmt.Sprintf("%s has no %s (Windows before 8, or Wine)", filepath.Base(userenv.Name), p.Name)
		}
	}
	return ""
}

// containerSID returns the SID of the profile name, creating the profile
// when it does not exist yet.
func containerSID(name string) (*windows.SID, error) {
	if m := missingProc(procCreateProfile, procDeriveSID); m != "" {
		return nil, errors.New(m)
	}
	n, err := windows.UTF16PtrFromString(name)
	if err != nil {
		return nil, err
	}
	display, _ := windows.UTF16PtrFromString("Metnos executors")
	desc, _ := windows.UTF16PtrFromString("Executors the Metnos device agent runs")
	var sid *windows.SID
	hr, _, _ := procCreateProfile.Call(uintptr(unsafe.Pointer(n)), uintptr(unsafe.Pointer(display)), uintptr(unsafe.Pointer(desc)), 0, 0, uintptr(unsafe.Pointer(&sid)))
	if uint32(hr) == hrAlreadyExists {
		hr, _, _ = procDeriveSID.Call(uintptr(unsafe.Pointer(n)), uintptr(unsafe.Pointer(&sid)))
	}
	if uint32(hr) != 0 || sid == nil {
		return nil, fmt.Errorf("the AppContainer profile %s: HRESULT %#x", name, uint32(hr))
	}
	defer windows.FreeSid(sid)
	return sid.Copy()
}

// DeleteContainerProfile removes this device's AppContainer profile
// (uninstall), once [RecoverGrants] has removed every entry a run left.
// Where Windows has no profiles it does nothing.
func DeleteContainerProfile(o Options) error {
	if missingProc(procDeleteProfile) != "" {
		return nil
	}
	n, err := windows.UTF16PtrFromString(containerName(o))
	if err != nil {
		return err
	}
	hr, _, _ := procDeleteProfile.Call(uintptr(unsafe.Pointer(n)))
	if uint32(hr) != 0 && uint32(hr) != 0x80070002 { // not found: gone already
		return fmt.Errorf("sandbox: deleting the AppContainer profile %s: HRESULT %#x", containerName(o), uint32(hr))
	}
	return nil
}

// containerCaps are the capability SIDs of names (internetClient).
func containerCaps(names []string) ([]windows.SIDAndAttributes, error) {
	var out []windows.SIDAndAttributes
	for _, n := range names {
		if n != capInternetClient {
			return nil, fmt.Errorf("sandbox: unknown AppContainer capability %q", n)
		}
		// Built from its string: Wine refuses CreateWellKnownSid for it.
		s, err := windows.StringToSid(sidInternetClient)
		if err != nil {
			return nil, err
		}
		out = append(out, windows.SIDAndAttributes{Sid: s, Attributes: windows.SE_GROUP_ENABLED})
	}
	return out, nil
}

// lowIntegrityToken is a restricted primary token of this process's
// user, its privileges dropped, at low integrity.
func lowIntegrityToken() (windows.Token, error) {
	if err := procCreateRestrictedToken.Find(); err != nil {
		return 0, err
	}
	var self windows.Token
	if err := windows.OpenProcessToken(windows.CurrentProcess(), windows.TOKEN_DUPLICATE|windows.TOKEN_QUERY|windows.TOKEN_ADJUST_DEFAULT|windows.TOKEN_ASSIGN_PRIMARY, &self); err != nil {
		return 0, fmt.Errorf("opening this process's token: %w", err)
	}
	defer self.Close()
	var t windows.Token
	r, _, err := procCreateRestrictedToken.Call(uintptr(self), disableMaxPrivilege, 0, 0, 0, 0, 0, 0, uintptr(unsafe.Pointer(&t)))
	if r == 0 {
		return 0, fmt.Errorf("CreateRestrictedToken: %w", err)
	}
	low, err := windows.StringToSid(sidLowIntegrity)
	if err != nil {
		t.Close()
		return 0, err
	}
	label := windows.Tokenmandatorylabel{Label: windows.SIDAndAttributes{Sid: low, Attributes: windows.SE_GROUP_INTEGRITY}}
	if err := windows.SetTokenInformation(t, windows.TokenIntegrityLevel, (*byte)(unsafe.Pointer(&label)), uint32(unsafe.Sizeof(label))+windows.GetLengthSid(low)); err != nil {
		t.Close()
		return 0, fmt.Errorf("setting the token's integrity level: %w", err)
	}
	return t, nil
}

// checkContainer reports whether the suspended process runs in the
// AppContainer sid: what its token says, not what the call that started
// it returned (Wine starts an ordinary process).
func checkContainer(process windows.Handle, sid *windows.SID) error {
	var t windows.Token
	if err := windows.OpenProcessToken(process, windows.TOKEN_QUERY, &t); err != nil {
		return fmt.Errorf("reading its token: %w", err)
	}
	defer t.Close()
	var is uint32
	var n uint32
	if err := windows.GetTokenInformation(t, tokenIsAppContainer, (*byte)(unsafe.Pointer(&is)), 4, &n); err != nil {
		return fmt.Errorf("reading whether its token is an AppContainer's: %w", err)
	}
	if is == 0 {
		return errors.New("its token is not an AppContainer's")
	}
	buf := make([]byte, 256)
	if err := windows.GetTokenInformation(t, tokenAppContainerSid, &buf[0], uint32(len(buf)), &n); err != nil {
		return fmt.Errorf("reading its AppContainer's SID: %w", err)
	}
	got := *(**windows.SID)(unsafe.Pointer(&buf[0]))
	if got == nil || !got.Equals(sid) {
		return fmt.Errorf("it runs in the AppContainer %v, not %v", got, sid)
	}
	return nil
}

// checkLowIntegrity reports whether the suspended process runs at low
// integrity.
func checkLowIntegrity(process windows.Handle) error {
	var t windows.Token
	if err := windows.OpenProcessToken(process, windows.TOKEN_QUERY, &t); err != nil {
		return fmt.Errorf("reading its token: %w", err)
	}
	defer t.Close()
	buf := make([]byte, 128)
	var n uint32
	if err := windows.GetTokenInformation(t, windows.TokenIntegrityLevel, &buf[0], uint32(len(buf)), &n); err != nil {
		return fmt.Errorf("reading its integrity level: %w", err)
	}
	label := (*windows.Tokenmandatorylabel)(unsafe.Pointer(&buf[0]))
	if s := label.Label.Sid.String(); s != sidLowIntegrity {
		return fmt.Errorf("it runs at integrity %s, not low (%s)", s, sidLowIntegrity)
	}
	return nil
}

// labelLow gives dir (and what it will hold) the low mandatory label, so
// that a low-integrity command may write there.
func labelLow(dir string) error {
	sd, err := windows.SecurityDescriptorFromString("S:(ML;OICI;NW;;;LW)")
	if err != nil {
		return err
	}
	sacl, _, err := sd.SACL()
	if err != nil {
		return err
	}
	if err := windows.SetNamedSecurityInfo(dir, windows.SE_FILE_OBJECT, windows.LABEL_SECURITY_INFORMATION, nil, nil, nil, sacl); err != nil {
		return fmt.Errorf("sandbox: labelling %s low integrity: %w", dir, err)
	}
	return nil
}

// winCaps is what Probe found, once per process and set of options:
// starting a process suspended in each rung and reading its token is
// the only proof a rung works here.
var winCaps struct {
	sync.Mutex
	done map[string]Caps
}

// probeRungs fills c's AppContainer and low-integrity fields, trying
// each once per process for these options.
func probeRungs(o Options, c Caps) Caps {
	key := o.NoAppContainer + "\x00" + containerName(o)
	winCaps.Lock()
	defer winCaps.Unlock()
	if got, ok := winCaps.done[key]; ok {
		got.Disabled = c.Disabled
		return got
	}
	trial := filepath.Join(systemDirsOrEmpty(), "cmd.exe")
	if o.NoAppContainer != "" {
		c.AppContainerNote = o.NoAppContainer
	} else if err := tryContainer(o, trial); err != nil {
		c.AppContainerNote = err.Error()
	} else {
		c.AppContainer = true
	}
	if err := tryLowIntegrity(trial); err != nil {
		c.LowIntegrityNote = err.Error()
	} else {
		c.LowIntegrity = true
	}
	if winCaps.done == nil {
		winCaps.done = map[string]Caps{}
	}
	winCaps.done[key] = c
	return c
}

// forgetRungs drops what Probe found (a run whose rung failed its check).
func forgetRungs() {
	winCaps.Lock()
	winCaps.done = nil
	winCaps.Unlock()
}

func systemDirsOrEmpty() string {
	if d := systemDirs(); len(d) > 0 {
		return d[0]
	}
	return ""
}

// tryContainer starts exe suspended in the AppContainer, checks its
// token and kills it: it never runs an instruction.
func tryContainer(o Options, exe string) error {
	sid, err := containerSID(containerName(o))
	if err != nil {
		return err
	}
	ch, err := startSuspended(exe, []string{exe}, containerEnv(nil), filepath.Dir(exe), spawnOpts{container: sid})
	if err != nil {
		return fmt.Errorf("a process could not be started in the AppContainer: %w", err)
	}
	defer ch.close()
	defer ch.closePipes()
	defer ch.kill(jobKilledExitCode)
	if err := checkContainer(ch.process, sid); err != nil {
		return fmt.Errorf("a process started in the AppContainer did not run in one: %w", err)
	}
	return nil
}

// tryLowIntegrity starts exe suspended with a low-integrity token,
// checks its token and kills it.
func tryLowIntegrity(exe string) error {
	t, err := lowIntegrityToken()
	if err != nil {
		return err
	}
	defer t.Close()
	ch, err := startSuspended(exe, []string{exe}, nil, filepath.Dir(exe), spawnOpts{token: t})
	if err != nil {
		return fmt.Errorf("a process could not be started with a low-integrity token: %w", err)
	}
	defer ch.close()
	defer ch.closePipes()
	defer ch.kill(jobKilledExitCode)
	if err := checkLowIntegrity(ch.process); err != nil {
		return fmt.Errorf("a process started with a low-integrity token did not run at low integrity: %w", err)
	}
	return nil
}

// winACL changes access lists on this machine (aclOps).
type winACL struct{}

// dacl reads path's access list as bytes, and whether it is protected
// (inherits nothing from the folder above).
func (winACL) dacl(path string) ([]byte, bool, error) {
	sd, err := windows.GetNamedSecurityInfo(path, windows.SE_FILE_OBJECT, windows.DACL_SECURITY_INFORMATION)
	if err != nil {
		return nil, false, err
	}
	control, _, err := sd.Control()
	if err != nil {
		return nil, false, err
	}
	acl, _, err := sd.DACL()
	if err != nil {
		return nil, false, err
	}
	if acl == nil {
		return nil, false, fmt.Errorf("%s has no access list (everyone may do everything)", path)
	}
	size := int(*(*uint16)(unsafe.Add(unsafe.Pointer(acl), 2)))
	b := make([]byte, size)
	copy(b, unsafe.Slice((*byte)(unsafe.Pointer(acl)), size))
	runtime.KeepAlive(sd)
	return b, control&windows.SE_DACL_PROTECTED != 0, nil
}

// set writes path's access list, keeping whether it is protected: a
// list that inherited nothing (~/.ssh for Windows' OpenSSH) must not
// start to inherit, nor one that did stop.
func (winACL) set(path string, acl []byte, protected bool) error {
	info := windows.SECURITY_INFORMATION(windows.DACL_SECURITY_INFORMATION | windows.UNPROTECTED_DACL_SECURITY_INFORMATION)
	if protected {
		info = windows.DACL_SECURITY_INFORMATION | windows.PROTECTED_DACL_SECURITY_INFORMATION
	}
	return windows.SetNamedSecurityInfo(path, windows.SE_FILE_OBJECT, info, nil, nil, (*windows.ACL)(unsafe.Pointer(&acl[0])), nil)
}

func sidBytes(s string) ([]byte, error) {
	sid, err := windows.StringToSid(s)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(sid)), windows.GetLengthSid(sid)), nil
}

func (w winACL) has(path, sid string, e ace) (bool, error) {
	acl, _, err := w.dacl(path)
	if err != nil {
		return false, err
	}
	b, err := sidBytes(sid)
	if err != nil {
		return false, err
	}
	return aclHas(acl, b, e)
}

func (w winACL) add(path, sid string, e ace) error {
	acl, protected, err := w.dacl(path)
	if err != nil {
		return err
	}
	b, err := sidBytes(sid)
	if err != nil {
		return err
	}
	next, changed, err := aclAdd(acl, b, e)
	if err != nil || !changed {
		return err
	}
	return w.set(path, next, protected)
}

func (w winACL) remove(path, sid string, e ace) error {
	acl, protected, err := w.dacl(path)
	if errors.Is(err, windows.ERROR_FILE_NOT_FOUND) || errors.Is(err, windows.ERROR_PATH_NOT_FOUND) {
		return nil
	}
	if err != nil {
		return err
	}
	b, err := sidBytes(sid)
	if err != nil {
		return err
	}
	next, changed, err := aclRemove(acl, b, e)
	if err != nil || !changed {
		return err
	}
	return w.set(path, next, protected)
}

// ledgerFor is the grant ledger of o for the container sid, for this
// process.
func ledgerFor(o Options, sid string, log *slog.Logger) *grantLedger {
	dir := o.GrantLedger
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sandbox-grants-"+strings.ReplaceAll(sid, "-", ""))
	}
	return &grantLedger{dir: dir, sid: sid, ops: winACL{}, self: thisProc(), alive: procAlive, log: log}
}

// thisProc is this process as records name it.
func thisProc() procID {
	return procID{PID: os.Getpid(), Created: created(windows.CurrentProcess())}
}

// created is when process was created, in 100 ns units since 1601 (0
// when it cannot be read).
func created(process windows.Handle) int64 {
	var c, e, k, u windows.Filetime
	if err := windows.GetProcessTimes(process, &c, &e, &k, &u); err != nil {
		return 0
	}
	return int64(c.HighDateTime)<<32 | int64(c.LowDateTime)
}

// procAlive reports whether the process p names still runs: its pid is
// in use by a process created at the same time.
func procAlive(p procID) bool {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION|windows.SYNCHRONIZE, false, uint32(p.PID))
	if err != nil {
		return errors.Is(err, windows.ERROR_ACCESS_DENIED) // someone else's: not ours to judge gone
	}
	defer windows.CloseHandle(h)
	if ev, _ := windows.WaitForSingleObject(h, 0); ev == windows.WAIT_OBJECT_0 {
		return false
	}
	return p.Created == 0 || created(h) == p.Created
}

// RecoverGrants removes the access entries that runs cut short (a
// killed agent, a crash) left for this device's AppContainer, and their
// records. run, doctor and uninstall call it. It returns how many runs'
// entries it removed; without AppContainers it does nothing.
func RecoverGrants(o Options, log *slog.Logger) (int, error) {
	if missingProc(procDeriveSID) != "" {
		return 0, nil
	}
	n, err := windows.UTF16PtrFromString(containerName(o))
	if err != nil {
		return 0, err
	}
	var sid *windows.SID
	// Derived, not created: recovering makes no profile.
	if hr, _, _ := procDeriveSID.Call(uintptr(unsafe.Pointer(n)), uintptr(unsafe.Pointer(&sid))); uint32(hr) != 0 || sid == nil {
		return 0, nil
	}
	s := sid.String()
	windows.FreeSid(sid)
	l := ledgerFor(o, s, log)
	if _, err := os.Stat(l.dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return l.recover()
}
