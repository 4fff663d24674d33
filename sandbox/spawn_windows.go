package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unicode/utf16"
	"unsafe"

	"golang.org/x/sys/windows"
)

// child is a process created suspended, with the parent's ends of its
// standard pipes.
type child struct {
	process, thread windows.Handle
	pid             uint32
	// stdin is the write end of the child's standard input; stdout and
	// stderr are the read ends of its output.
	stdin, stdout, stderr windows.Handle
}

// spawnOpts say what the child runs as: in the AppContainer container
// (with the capabilities caps), or with the primary token token, or
// (zero) as the agent's own user.
type spawnOpts struct {
	container *windows.SID
	caps      []windows.SIDAndAttributes
	token     windows.Token
}

// startSuspended creates exe as a suspended process with command line
// argv, environment env (exactly: nothing of the agent's is added) and
// working directory dir, as o says. The child inherits its three pipe
// ends and no other handle. Not one instruction of it runs before
// resume; the caller checks that it runs as o says first.
func startSuspended(exe string, argv, env []string, dir string, o spawnOpts) (*child, error) {
	block, err := envBlock(env)
	if err != nil {
		return nil, fmt.Errorf("sandbox: environment for %s: %w", exe, err)
	}
	exeW, err := windows.UTF16PtrFromString(exe)
	if err != nil {
		return nil, fmt.Errorf("sandbox: executable %q: %w", exe, err)
	}
	cmdW, err := windows.UTF16PtrFromString(windows.ComposeCommandLine(argv))
	if err != nil {
		return nil, fmt.Errorf("sandbox: command line of %s: %w", exe, err)
	}
	dirW, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: working directory %q: %w", dir, err)
	}
	var c child
	var theirs [3]windows.Handle // the child's stdin, stdout, stderr
	defer closeHandles(theirs[:])
	if theirs[0], c.stdin, err = inheritablePipe(true); err == nil {
		if c.stdout, theirs[1], err = inheritablePipe(false); err == nil {
			c.stderr, theirs[2], err = inheritablePipe(false)
		}
	}
	if err != nil {
		c.closePipes()
		return nil, fmt.Errorf("sandbox: pipes for %s: %w", exe, err)
	}
	nattrs := uint32(1)
	if o.container != nil {
		nattrs++
	}
	attrs, err := windows.NewProcThreadAttributeList(nattrs)
	if err != nil {
		c.closePipes()
		return nil, fmt.Errorf("sandbox: attributes for %s: %w", exe, err)
	}
	defer attrs.Delete()
	// Only these three handles are inherited, whatever else is
	// inheritable in the agent at this moment.
	if err := attrs.Update(windows.PROC_THREAD_ATTRIBUTE_HANDLE_LIST,
		unsafe.Pointer(&theirs[0]), uintptr(len(theirs))*unsafe.Sizeof(theirs[0])); err != nil {
		c.closePipes()
		return nil, fmt.Errorf("sandbox: handle list for %s: %w", exe, err)
	}
	var sc securityCapabilities
	if o.container != nil {
		sc.AppContainerSid = o.container
		if len(o.caps) > 0 {
			sc.Capabilities, sc.CapabilityCount = &o.caps[0], uint32(len(o.caps))
		}
		// Wine refuses this attribute (ERROR_NOT_SUPPORTED): never go on
		// to start an ordinary process in its stead.
		if err := attrs.Update(procThreadAttributeSecurityCapabilities, unsafe.Pointer(&sc), unsafe.Sizeof(sc)); err != nil {
			c.closePipes()
			return nil, fmt.Errorf("sandbox: the AppContainer attribute for %s: %w", exe, err)
		}
	}
	si := windows.StartupInfoEx{ProcThreadAttributeList: attrs.List()}
	si.Cb = uint32(unsafe.Sizeof(si))
	si.Flags = windows.STARTF_USESTDHANDLES
	si.StdInput, si.StdOutput, si.StdErr = theirs[0], theirs[1], theirs[2]
	const flags = windows.CREATE_SUSPENDED | windows.CREATE_NO_WINDOW |
		windows.CREATE_UNICODE_ENVIRONMENT | windows.EXTENDED_STARTUPINFO_PRESENT
	var pi windows.ProcessInformation
	if o.token != 0 {
		err = windows.CreateProcessAsUser(o.token, exeW, cmdW, nil, nil, true, flags, &block[0], dirW, &si.StartupInfo, &pi)
	} else {
		err = windows.CreateProcess(exeW, cmdW, nil, nil, true, flags, &block[0], dirW, &si.StartupInfo, &pi)
	}
	runtime.KeepAlive(&sc)
	runtime.KeepAlive(o.caps)
	if err != nil {
		c.closePipes()
		return nil, fmt.Errorf("sandbox: starting %s: %w", exe, err)
	}
	c.process, c.thread, c.pid = pi.Process, pi.Thread, pi.ProcessId
	return &c, nil
}

// resume lets the child's first thread run.
func (c *child) resume() error {
	if _, err := windows.ResumeThread(c.thread); err != nil {
		return fmt.Errorf("sandbox: resuming process %d: %w", c.pid, err)
	}
	return nil
}

// kill terminates the child alone.
func (c *child) kill(code uint32) error {
	if err := windows.TerminateProcess(c.process, code); err != nil {
		return fmt.Errorf("sandbox: terminating process %d: %w", c.pid, err)
	}
	return nil
}

// exitCode is the child's exit status, once it has ended.
func (c *child) exitCode() (uint32, error) {
	var code uint32
	if err := windows.GetExitCodeProcess(c.process, &code); err != nil {
		return 0, fmt.Errorf("sandbox: exit status of process %d: %w", c.pid, err)
	}
	return code, nil
}

// close closes the process and thread handles.
func (c *child) close() {
	closeHandles([]windows.Handle{c.process, c.thread})
	c.process, c.thread = 0, 0
}

// closePipes closes the parent's ends of the pipes.
func (c *child) closePipes() {
	closeHandles([]windows.Handle{c.stdin, c.stdout, c.stderr})
	c.stdin, c.stdout, c.stderr = 0, 0, 0
}

func closeHandles(hs []windows.Handle) {
	for _, h := range hs {
		if h != 0 {
			windows.CloseHandle(h)
		}
	}
}

// inheritablePipe makes a pipe whose child end is inheritable and whose
// parent end is not. When childReads is true the child gets the read end.
func inheritablePipe(childReads bool) (r, w windows.Handle, err error) {
	sa := windows.SecurityAttributes{InheritHandle: 1}
	sa.Length = uint32(unsafe.Sizeof(sa))
	if err := windows.CreatePipe(&r, &w, &sa, 0); err != nil {
		return 0, 0, err
	}
	ours := r
	if childReads {
		ours = w
	}
	if err := windows.SetHandleInformation(ours, windows.HANDLE_FLAG_INHERIT, 0); err != nil {
		windows.CloseHandle(r)
		windows.CloseHandle(w)
		return 0, 0, err
	}
	return r, w, nil
}

// envBlock encodes env as a CreateProcess environment block: UTF-16
// "KEY=value" strings, each NUL-terminated, then one more NUL. An empty
// env gives an empty block, not the agent's environment.
func envBlock(env []string) ([]uint16, error) {
	var b []uint16
	for _, kv := range env {
		if strings.IndexByte(kv, 0) >= 0 {
			return nil, fmt.Errorf("variable %q holds a NUL byte", kv)
		}
		if !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("variable %q is not KEY=value", kv)
		}
		b = append(b, utf16.Encode([]rune(kv))...)
		b = append(b, 0)
	}
	if len(b) == 0 {
		b = append(b, 0)
	}
	return append(b, 0), nil
}

// envValue returns the value of key in env, whose keys Windows compares
// without case.
func envValue(env []string, key string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.EqualFold(k, key) {
			return v, true
		}
	}
	return "", false
}

// withEnv returns env with key set to val, replacing any spelling of key.
func withEnv(env []string, key, val string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.EqualFold(k, key) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, key+"="+val)
}

// defaultPathExt is used when the command's environment has no PATHEXT.
const defaultPathExt = ".COM;.EXE;.BAT;.CMD"

// errNotFound is wrapped when the command cannot be found.
var errNotFound = errors.New("executable file not found")

// lookPath finds the executable for name as Windows would, but in the
// command's own environment and never in the current directory: a name
// with a directory part is taken as it is (with each PATHEXT extension
// tried when it has none that exists); a bare name is searched in the
// PATH of env, else in the system directories. isFile reports whether a
// path is an existing regular file.
func lookPath(name string, env []string, isFile func(string) bool) (string, error) {
	exts := pathExts(env)
	if strings.ContainsAny(name, `\/:`) {
		if p, ok := withExt(name, exts, isFile); ok {
			return p, nil
		}
		return "", fmt.Errorf("sandbox: %s: %w", name, errNotFound)
	}
	var dirs []string
	if path, ok := envValue(env, "PATH"); ok {
		dirs = filepath.SplitList(path)
	} else {
		dirs = systemDirs()
	}
	for _, dir := range dirs {
		if dir = strings.Trim(dir, `"`); dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if p, ok := withExt(filepath.Join(dir, name), exts, isFile); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("sandbox: %s in the command's PATH: %w", name, errNotFound)
}

// pathExts lists the executable extensions of env's PATHEXT, lower case.
func pathExts(env []string) []string {
	pe, ok := envValue(env, "PATHEXT")
	if !ok || strings.TrimSpace(pe) == "" {
		pe = defaultPathExt
	}
	var exts []string
	for _, e := range strings.Split(strings.ToLower(pe), ";") {
		if e = strings.TrimSpace(e); e != "" {
			if e[0] != '.' {
				e = "." + e
			}
			exts = append(exts, e)
		}
	}
	return exts
}

// withExt returns path itself when it already ends in an executable
// extension and exists, else the first path+ext that exists.
func withExt(path string, exts []string, isFile func(string) bool) (string, bool) {
	ext := strings.ToLower(filepath.Ext(path))
	for _, e := range exts {
		if ext == e && isFile(path) {
			return path, true
		}
	}
	for _, e := range exts {
		if isFile(path + e) {
			return path + e, true
		}
	}
	return "", false
}

// systemDirs are System32 and the Windows directory.
func systemDirs() []string {
	var dirs []string
	if d, err := windows.GetSystemDirectory(); err == nil {
		dirs = append(dirs, d)
	}
	if d, err := windows.GetWindowsDirectory(); err == nil {
		dirs = append(dirs, d)
	}
	return dirs
}

// isRegularFile reports whether path names an existing regular file.
func isRegularFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
