package shim

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// layer mounts spec's overlays in this process's own mount namespace,
// makes spec.Mkdirs, opens spec.Reopen again, drops its capabilities
// and executes argv (bubblewrap). It returns only when that fails.
func layer(status *os.File, spec LayerSpec, argv []string) int {
	// Capabilities (the ambient one the agent gave, or all of them for
	// uid 0 in this namespace) belong to the thread: the one that drops
	// them is the one that executes bubblewrap.
	runtime.LockOSThread()
	if err := mountLayers(spec); err != nil {
		return failLayer(status, err)
	}
	// bubblewrap refuses to start with capabilities it did not get from
	// a set-user-ID bit (and needs none): the ambient set goes, so that
	// executing it as any uid but 0 leaves none. As uid 0 of this
	// namespace it keeps them there, as a root agent's bubblewrap keeps
	// its own: it drops them for the command itself.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return failLayer(status, fmt.Errorf("dropping the ambient capabilities: %w", err))
	}
	// bubblewrap starts with an empty environment, as without a layer,
	// and as LayerBwrap.
	err := syscall.Exec(argv[0], append([]string{LayerBwrap}, argv[1:]...), []string{})
	return failLayer(status, fmt.Errorf("executing %s: %w", argv[0], err))
}

// mountLayers is the stage's work before bubblewrap (see LayerSpec).
func mountLayers(spec LayerSpec) error {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &st); err != nil {
		return fmt.Errorf("reading this process's mount namespace: %w", err)
	}
	if spec.HostMountNS == 0 || st.Ino == spec.HostMountNS {
		return errors.New("the layer stage is in the agent's own mount namespace, not one of its own: nothing mounted")
	}
	// Nothing mounted here may show anywhere else.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mount namespace private: %w", err)
	}
	fstype := spec.FSType
	if fstype == "" {
		fstype = "overlay"
	}
	for _, o := range spec.Layers {
		if err := mountOverlay(fstype, o); err != nil {
			return err
		}
	}
	for _, d := range spec.Mkdirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("making %s beneath the layer: %w", d, err)
		}
	}
	for _, r := range spec.Reopen {
		fd, err := openNoLinks(r.Path, unix.O_PATH)
		if err != nil {
			return fmt.Errorf("opening the grant %s again beneath the layer: %w", r.Path, err)
		}
		err = unix.Dup3(fd, r.FD, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("handing the grant %s to bubblewrap: %w", r.Path, err)
		}
	}
	return nil
}

// openNoLinks opens the canonical path p without following any
// symbolic link, close-on-exec.
func openNoLinks(p string, flags uint64) (int, error) {
	return unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
}

// mountOverlay mounts one overlay of file system fstype on o.Path,
// whose lower layer is the folder found there (which must be the one
// the agent found), with the userxattr option: the only one an overlay
// mounted outside the initial user namespace may have. Every path goes
// to the kernel as a descriptor opened without following links.
func mountOverlay(fstype string, o Overlay) error {
	target, err := openNoLinks(o.Path, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("opening %s to put it behind the layer: %w", o.Path, err)
	}
	defer unix.Close(target)
	var st unix.Stat_t
	if err := unix.Fstat(target, &st); err != nil {
		return fmt.Errorf("reading %s: %w", o.Path, err)
	}
	if st.Dev != o.Dev || st.Ino != o.Ino {
		return fmt.Errorf("%s is no longer the folder the agent planned the dry run for", o.Path)
	}
	dirs := map[string]int{"lowerdir": target}
	for key, p := range map[string]string{"upperdir": o.Upper, "workdir": o.Work} {
		fd, err := openNoLinks(p, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("opening the layer's %s %s: %w", key, p, err)
		}
		defer unix.Close(fd)
		dirs[key] = fd
	}
	fsfd, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("the kernel has no %s file system to put %s behind: %w", fstype, o.Path, err)
	}
	defer unix.Close(fsfd)
	fail := func(step string, err error) error {
		return fmt.Errorf("mounting an overlay on %s (%s): %w%s", o.Path, step, err, fsMessages(fsfd))
	}
	for _, key := range []string{"lowerdir", "upperdir", "workdir"} {
		if err := unix.FsconfigSetString(fsfd, key, "/proc/self/fd/"+strconv.Itoa(dirs[key])); err != nil {
			return fail(key, err)
		}
	}
	if err := unix.FsconfigSetFlag(fsfd, "userxattr"); err != nil {
		return fail("userxattr", err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fail("create", err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fail("fsmount", err)
	}
	defer unix.Close(mnt)
	if err := unix.MoveMount(mnt, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fail("move_mount", err)
	}
	return nil
}

// fsMessages is what the file system context fsfd logged (the kernel's
// own words for a failed overlay), as ": msg; msg", or "".
func fsMessages(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 8 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}
