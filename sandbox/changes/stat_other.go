//go:build !linux

package changes

import (
	"fmt"
	"io/fs"
	"os"
)

// lstat reads the entry at p without following a symbolic link at its
// end.
func lstat(p string) (Entry, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Kind: kindOf(fi.Mode())}
	if e.Kind != Symlink {
		e.State.Mode = modeString(fi.Mode())
	}
	switch e.Kind {
	case Symlink:
		if e.State.Target, err = os.Readlink(p); err != nil {
			return Entry{}, err
		}
	case File:
		size := fi.Size()
		e.State.Size = &size
		if f, err := os.Open(p); err == nil {
			e.State.SHA256, _ = hashFile(f)
			f.Close()
		}
	}
	return e, nil
}

// modeString writes m's permission and special bits in octal.
func modeString(m fs.FileMode) string {
	v := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	return fmt.Sprintf("%04o", v)
}

// kindOf is the Kind of a file mode.
func kindOf(m fs.FileMode) Kind {
	switch {
	case m.IsRegular():
		return File
	case m.IsDir():
		return Dir
	case m&fs.ModeSymlink != 0:
		return Symlink
	}
	return Other
}
