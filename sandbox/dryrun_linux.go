package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/changes"
	"github.com/metnos/agent/sandbox/shim"
)

// The Linux dry run: every folder the run may write goes behind an
// overlay, mounted by the layer stage (shim.LayerArg) in a user and
// mount namespace of the run's own before it becomes bubblewrap; the
// upper layers, in a private scratch folder, take every write, and are
// read (package changes) and removed once the run's tree is gone.

// dryRunRefusal says why a dry run of p cannot be made with the plan pl
// on a machine with c ("" when it can be tried; the kernel may still
// refuse the overlay, and the layer stage then says why).
func dryRunRefusal(c Caps, pl Plan, p policy.Policy) string {
	const what = "a dry run puts every folder the run may write behind a copy-on-write layer (an overlay) in a mount namespace of the run's own"
	switch {
	case c.Disabled != "":
		return what + ", and the sandbox is off here (" + c.Disabled + "): refused rather than run for real"
	case !pl.lay.bwrap:
		return what + ", which needs bubblewrap's namespaces, and this run would have none: " + pl.Reason + ": refused rather than run for real"
	case p.RootWritable:
		return fmt.Sprintf("the policy (profile %s) makes the whole root writable, and a dry run layers the folders a policy grants, not the root: refused rather than run for real", p.Profile)
	}
	return ""
}

// dryRun is one dry run's layers: made before the launch, read and
// removed after it.
type dryRun struct {
	// scratch holds the layers' upper and work folders ("" when there
	// is nothing to layer).
	scratch string
	// overlays are what the layer stage mounts, and layers what
	// package changes reads, one for one.
	overlays []shim.Overlay
	layers   []changes.Layer
	// own are the agent's own writable grants: what changed beneath
	// them is not listed.
	own []string
	// spec is the layer stage's, completed by the launch (Mkdirs,
	// Reopen).
	spec shim.LayerSpec
	// placeholders are the paths bubblewrap creates as mount points of
	// masks beneath the layers (and the folders above them the stage
	// makes): not the command's changes.
	placeholders map[string]bool
	// have is the sandbox word of the run's plan, for a refusal.
	have string
	log  *slog.Logger
}

// newDryRun plans the layers of a dry run of l: one overlay per
// writable folder the bwrap view binds (a writable file's folder for a
// file), but those inside another. A folder it cannot layer refuses the
// run.
func newDryRun(l layout, o Options, have string, log *slog.Logger) (*dryRun, error) {
	refuse := func(format string, a ...any) error {
		return &RefusedError{Have: have, Why: fmt.Sprintf(format, a...) + ": refused rather than run for real", DryRun: true}
	}
	d := &dryRun{placeholders: map[string]bool{}, have: have, log: log}
	var roots []string
	for _, g := range l.Grants {
		if g.Access != policy.Write || l.inParent[g.Path] {
			continue
		}
		if g.Own {
			d.own = append(d.own, g.Path)
		}
		fi, err := os.Lstat(g.Path)
		if err != nil {
			return nil, fmt.Errorf("sandbox: dry run: the writable grant %s: %w", g.Path, err)
		}
		root := g.Path
		if !fi.IsDir() {
			// An overlay goes on a folder: a file's is layered whole,
			// and the bind shows the file through it.
			root = filepath.Dir(g.Path)
		}
		if root == "/" {
			return nil, refuse("the writable grant %s lies in /, which a dry run cannot put behind a layer", g.Path)
		}
		roots = append(roots, root)
	}
	slices.Sort(roots)
	roots = slices.Compact(roots)
	var kept []string
	for _, r := range roots {
		if !slices.ContainsFunc(kept, func(k string) bool { return within(r, k) }) {
			kept = append(kept, r)
		}
	}
	d.spec.FSType = o.dryRunFS
	if len(kept) == 0 {
		return d, nil
	}
	base, err := scratchBase(o.DryRunScratch, kept, viewBinds(l.Policy))
	if err != nil {
		if why, ok := err.(scratchRefusal); ok {
			return nil, refuse("%s", string(why))
		}
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &st); err != nil {
		return nil, fmt.Errorf("sandbox: dry run: this process's mount namespace: %w", err)
	}
	d.spec.HostMountNS = st.Ino
	removeStaleScratch(base, log)
	if d.scratch, err = os.MkdirTemp(base, fmt.Sprintf("metnos-dry-%d-", os.Getpid())); err != nil {
		return nil, fmt.Errorf("sandbox: dry run: the scratch folder: %w", err)
	}
	for i, r := range kept {
		o, err := d.prepare(i, r)
		if err != nil {
			d.remove()
			return nil, err
		}
		d.overlays = append(d.overlays, o)
		ownRoot := slices.ContainsFunc(d.own, func(p string) bool { return within(r, p) })
		d.layers = append(d.layers, changes.Layer{Lower: r, Upper: o.Upper, Unlisted: ownRoot})
	}
	d.spec.Layers = d.overlays
	return d, nil
}

// scratchRefusal is why no folder can hold a dry run's layers.
type scratchRefusal string

func (r scratchRefusal) Error() string { return string(r) }

// scratchBase is the folder a dry run's layers go in: given when it is
// set (Options.DryRunScratch), else the first of the temporary folder
// and /var/tmp that exists, lies outside every folder the run layers
// (kept) and is hidden from the run's view. Upstream executors' manifests
// grant "/tmp/**" for writing, so that /tmp is layered and the layers go
// to /var/tmp. A scratchRefusal says why none can.
func scratchBase(given string, kept []string, view []bind) (string, error) {
	cands := []string{given}
	if given == "" {
		cands = []string{os.TempDir(), "/var/tmp"}
	}
	var whys []string
	for _, c := range cands {
		base, err := filepath.EvalSymlinks(c)
		if err != nil {
			if given != "" {
				return "", fmt.Errorf("sandbox: dry run: the scratch folder: %w", err)
			}
			whys = append(whys, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		if i := slices.IndexFunc(kept, func(r string) bool { return within(base, r) }); i >= 0 {
			whys = append(whys, fmt.Sprintf("%s lies in %s, which the run may write and the dry run must put behind a layer", base, kept[i]))
			continue
		}
		if vis, wr := lookupView(view, base); vis && (wr || given == "") {
			whys = append(whys, fmt.Sprintf("%s would be visible inside the sandbox", base))
			continue
		}
		return base, nil
	}
	return "", scratchRefusal("no folder can hold the dry run's layers (" + strings.Join(whys, "; ") +
		"): set METNOS_DRY_RUN_SCRATCH, or TMPDIR, to a folder of the agent's user outside the folders executors may write")
}

// prepare makes the upper and work folders of the i-th layer, on root:
// the upper one with root's mode (and, for root, its owner), as the
// overlay's root shows the upper folder's.
func (d *dryRun) prepare(i int, root string) (shim.Overlay, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return shim.Overlay{}, fmt.Errorf("sandbox: dry run: opening %s: %w", root, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return shim.Overlay{}, fmt.Errorf("sandbox: dry run: reading %s: %w", root, err)
	}
	o := shim.Overlay{Path: root, Dev: st.Dev, Ino: st.Ino,
		Upper: filepath.Join(d.scratch, "u"+strconv.Itoa(i)), Work: filepath.Join(d.scratch, "w"+strconv.Itoa(i))}
	for _, p := range []string{o.Upper, o.Work} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return o, fmt.Errorf("sandbox: dry run: %w", err)
		}
	}
	if err := os.Chmod(o.Upper, os.FileMode(st.Mode&0o777)|modeSpecial(st.Mode)); err != nil {
		return o, fmt.Errorf("sandbox: dry run: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(o.Upper, int(st.Uid), int(st.Gid)); err != nil {
			return o, fmt.Errorf("sandbox: dry run: %w", err)
		}
	}
	return o, nil
}

// modeSpecial is the set-user-ID, set-group-ID and sticky bits of a raw
// mode as a FileMode.
func modeSpecial(m uint32) os.FileMode {
	var out os.FileMode
	if m&unix.S_ISUID != 0 {
		out |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		out |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		out |= os.ModeSticky
	}
	return out
}

// layered reports whether path lies in a folder behind a layer.
func (d *dryRun) layered(path string) bool {
	return slices.ContainsFunc(d.overlays, func(o shim.Overlay) bool { return within(path, o.Path) })
}

// bind completes the layer stage's spec for the bwrap view: the grants
// bound by descriptor beneath a layer are opened again in the stage's
// mount namespace (a descriptor of the agent's shows the real folder,
// which bubblewrap would refuse to bind there, or bind), and the
// folders above the placeholders are made there, beneath the layers,
// rather than on the host. A placeholder outside every layer refuses
// the run: it would be made for real.
func (d *dryRun) bind(p policy.Policy, grantFDs map[string]int, phs []placeholder) error {
	for _, g := range p.Grants {
		if fd, ok := grantFDs[g.Path]; ok && d.layered(g.Path) {
			d.spec.Reopen = append(d.spec.Reopen, shim.Reopen{FD: fd, Path: g.Path})
		}
	}
	for _, ph := range phs {
		if !d.layered(ph.Path) {
			return &RefusedError{Have: d.have, DryRun: true, Why: fmt.Sprintf("the masked path %s would need a placeholder outside every folder the dry run layers: refused rather than made for real", ph.Path)}
		}
		d.spec.Mkdirs = append(d.spec.Mkdirs, filepath.Dir(ph.Path))
		// The path and the folders above it that did not exist.
		for _, c := range ph.Created {
			d.placeholders[c] = true
		}
	}
	return nil
}

// wrap returns argv (bubblewrap and its arguments) run by the layer
// stage of exe; argv as it is when there is nothing to layer.
func (d *dryRun) wrap(exe string, argv []string) ([]string, error) {
	if len(d.overlays) == 0 {
		return argv, nil
	}
	args, err := shim.EncodeLayerArgs(d.spec, argv)
	if err != nil {
		return nil, err
	}
	return append([]string{exe}, args...), nil
}

// layerCaps are the capabilities the layer stage has in its user
// namespace: CAP_SYS_ADMIN to mount, and those the overlay needs of
// its mounter, whose credentials it keeps for the work it does in the
// upper layer (its work folder is mode 0; a copy up keeps the file's
// owner, mode and times). In a user namespace that maps the agent's
// uid and gid alone, they bear on nothing but the agent's own files and
// that mount namespace; a root agent maps every id, as its own
// capabilities already bear on every file. bubblewrap, and the command,
// get none of them beyond what they get in any run (see
// shim.LayerArg): every write of the command is checked against its own
// credentials first.
var layerCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_CHOWN}

// namespaces makes the launch's process start in a user and a mount
// namespace of its own, with layerCaps there (ambient, so that they
// survive the exec of the layer stage); nothing when there is nothing
// to layer. The user namespace maps the agent's uid and gid to
// themselves; as root, every uid and gid to itself: the overlay copies
// a file up as its owner's, which must be mapped (a file of an unmapped
// owner cannot be written through the layer: EOVERFLOW), and a process
// without privileges may map its own ids alone.
func (d *dryRun) namespaces(a *syscall.SysProcAttr) {
	if len(d.overlays) == 0 {
		return
	}
	a.Cloneflags |= syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS
	a.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}}
	a.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}}
	if os.Getuid() == 0 {
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: allIDs}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: allIDs}}
	}
	a.GidMappingsEnableSetgroups = false
	a.AmbientCaps = layerCaps
}

// allIDs is the size of a user namespace's map of every id (the last,
// 4294967295, is the kernel's "no id").
const allIDs = 1<<32 - 1

// report reads what the run wrote into the layers: the changes beneath
// the folders layered, but the agent's own and the placeholders.
func (d *dryRun) report() (*DryRun, error) {
	r := &DryRun{Layer: "overlay", Layered: []string{}, Changes: []changes.Change{}}
	for _, l := range d.layers {
		if !l.Unlisted {
			r.Layered = append(r.Layered, l.Lower)
		}
	}
	if len(d.layers) == 0 {
		return r, nil
	}
	cs, err := changes.FromLayers(d.layers)
	if err != nil {
		return nil, fmt.Errorf("sandbox: dry run: %w", err)
	}
	var kept []changes.Change
	for _, c := range cs {
		if slices.ContainsFunc(d.own, func(p string) bool { return within(c.Path, p) }) {
			continue
		}
		kept = append(kept, c)
	}
	kept = d.dropPlaceholders(kept)
	if len(kept) > MaxDryRunChanges {
		r.More = len(kept) - MaxDryRunChanges
		kept = kept[:MaxDryRunChanges]
	}
	r.Changes = append(r.Changes, kept...)
	return r, nil
}

// dropPlaceholders leaves out of cs the folders and empty files the
// masks' placeholders made (they are not the command's, and a real run
// removes them afterwards), unless the command put something in one.
func (d *dryRun) dropPlaceholders(cs []changes.Change) []changes.Change {
	if len(d.placeholders) == 0 {
		return cs
	}
	drop := map[int]bool{}
	// Deepest first: a placeholder folder goes when all it holds went.
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return len(cs[b].Path) - len(cs[a].Path) })
	for _, i := range order {
		c := cs[i]
		if c.Op != changes.Created || !d.placeholders[c.Path] {
			continue
		}
		empty := c.Kind == changes.Dir || (c.Kind == changes.File && c.After != nil && c.After.Size != nil && *c.After.Size == 0)
		if !empty {
			continue
		}
		holds := false
		for j, o := range cs {
			if j != i && !drop[j] && o.Path != c.Path && within(o.Path, c.Path) {
				holds = true
				break
			}
		}
		if !holds {
			drop[i] = true
		}
	}
	var out []changes.Change
	for i, c := range cs {
		if !drop[i] {
			out = append(out, c)
		}
	}
	return out
}

// remove removes the scratch folder, whatever modes the run left in it
// (the overlay's work folder is made mode 0).
func (d *dryRun) remove() {
	if d.scratch == "" {
		return
	}
	if err := removeAll(d.scratch); err != nil && d.log != nil {
		d.log.Warn("sandbox: a dry run's scratch folder could not be removed", "dir", d.scratch, "err", err)
	}
}

// removeAll removes p and all it holds, giving every folder in it rwx
// to its owner first; it follows no symbolic link.
func removeAll(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_ = os.Chmod(p, 0o700)
		names, err := readDirNames(p)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := removeAll(filepath.Join(p, n)); err != nil {
				return err
			}
		}
	}
	return os.Remove(p)
}

func readDirNames(p string) ([]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

var staleScratchOnce sync.Once

// removeStaleScratch removes, once per process, the scratch folders of
// dry runs whose agent was killed mid-run (metnos-dry-<pid>-*, for a
// pid that no longer exists) in base.
func removeStaleScratch(base string, log *slog.Logger) {
	staleScratchOnce.Do(func() {
		matches, _ := filepath.Glob(filepath.Join(base, "metnos-dry-*-*"))
		for _, m := range matches {
			rest := strings.TrimPrefix(filepath.Base(m), "metnos-dry-")
			pidText, _, _ := strings.Cut(rest, "-")
			pid, err := strconv.Atoi(pidText)
			if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
				continue
			}
			if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == os.Getuid() {
					if err := removeAll(m); err != nil && log != nil {
						log.Warn("sandbox: a killed dry run's scratch folder could not be removed", "dir", m, "err", err)
					}
				}
			}
		}
	})
}
