package sandbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// A Windows discretionary access-control list, read and edited as the
// bytes Windows keeps it in, so that the AppContainer backend changes
// exactly the entries of its container's SID and nothing else, and so
// that every system tests it.

// Access masks and flags of the entries a run adds (winnt.h).
const (
	// maskRead is FILE_GENERIC_READ | FILE_GENERIC_EXECUTE.
	maskRead = 0x001200A9
	// maskModify is Modify: read, execute, write and DELETE; neither
	// WRITE_DAC, WRITE_OWNER nor FILE_DELETE_CHILD.
	maskModify = 0x001301BF
	// maskAll is FILE_ALL_ACCESS, what a deny entry denies.
	maskAll = 0x001F01FF

	aceTypeAllowed = 0 // ACCESS_ALLOWED_ACE_TYPE
	aceTypeDenied  = 1 // ACCESS_DENIED_ACE_TYPE

	aceObjectInherit    = 0x01
	aceContainerInherit = 0x02
	aceInherited        = 0x10 // INHERITED_ACE

	aclRevision = 2
)

// rawACE is what an ace is in a list: its type, flags and mask.
func rawACE(e ace) (typ, flags byte, mask uint32) {
	switch e.Rights {
	case aceRead:
		typ, mask = aceTypeAllowed, maskRead
	case aceModify:
		typ, mask = aceTypeAllowed, maskModify
	default:
		typ, mask = aceTypeDenied, maskAll
	}
	if e.Inherit {
		flags = aceObjectInherit | aceContainerInherit
	}
	return typ, flags, mask
}

// aclEntry is one entry of a list: its bytes, whole.
type aclEntry []byte

func (a aclEntry) typ() byte    { return a[0] }
func (a aclEntry) flags() byte  { return a[1] }
func (a aclEntry) mask() uint32 { return binary.LittleEndian.Uint32(a[4:8]) }

// sid is the entry's SID, for the allowed and denied types.
func (a aclEntry) sid() []byte { return a[8:] }

// matches reports whether a is, not inherited, the entry e for sid.
func (a aclEntry) matches(sid []byte, e ace) bool {
	typ, flags, mask := rawACE(e)
	return (a.typ() == aceTypeAllowed || a.typ() == aceTypeDenied) && a.flags()&aceInherited == 0 &&
		a.typ() == typ && a.flags() == flags && a.mask() == mask && bytes.Equal(a.sid(), sid)
}

// parseACL splits the list acl into its entries.
func parseACL(acl []byte) ([]aclEntry, error) {
	if len(acl) < 8 {
		return nil, errors.New("an access list shorter than its header")
	}
	size, count := int(binary.LittleEndian.Uint16(acl[2:4])), int(binary.LittleEndian.Uint16(acl[4:6]))
	if size < 8 || size > len(acl) {
		return nil, fmt.Errorf("an access list of %d bytes says it has %d", len(acl), size)
	}
	var out []aclEntry
	off := 8
	for i := 0; i < count; i++ {
		if off+4 > size {
			return nil, fmt.Errorf("entry %d of the access list is cut short", i)
		}
		n := int(binary.LittleEndian.Uint16(acl[off+2 : off+4]))
		if n < 4 || off+n > size {
			return nil, fmt.Errorf("entry %d of the access list has a size of %d", i, n)
		}
		out = append(out, aclEntry(acl[off:off+n]))
		off += n
	}
	return out, nil
}

// buildACL is the list of the entries es.
func buildACL(es []aclEntry) []byte {
	size := 8
	for _, e := range es {
		size += len(e)
	}
	b := make([]byte, 8, size)
	b[0] = aclRevision
	binary.LittleEndian.PutUint16(b[2:4], uint16(size))
	binary.LittleEndian.PutUint16(b[4:6], uint16(len(es)))
	for _, e := range es {
		b = append(b, e...)
	}
	return b
}

// newEntry is the entry e for sid, as bytes.
func newEntry(sid []byte, e ace) aclEntry {
	typ, flags, mask := rawACE(e)
	a := make([]byte, 8, 8+len(sid))
	a[0], a[1] = typ, flags
	binary.LittleEndian.PutUint16(a[2:4], uint16(8+len(sid)))
	binary.LittleEndian.PutUint32(a[4:8], mask)
	return append(a, sid...)
}

// aclHas reports whether the list acl holds, not inherited, the entry e
// for sid.
func aclHas(acl, sid []byte, e ace) (bool, error) {
	es, err := parseACL(acl)
	if err != nil {
		return false, err
	}
	for _, a := range es {
		if a.matches(sid, e) {
			return true, nil
		}
	}
	return false, nil
}

// aclAdd returns the list acl with the entry e for sid added where
// Windows' canonical order puts it (a deny after the explicit denies, an
// allow after the explicit allows, both before what is inherited), or
// acl itself when it holds the entry already.
func aclAdd(acl, sid []byte, e ace) ([]byte, bool, error) {
	es, err := parseACL(acl)
	if err != nil {
		return nil, false, err
	}
	var deny, allow, inherited []aclEntry
	for _, a := range es {
		switch {
		case a.matches(sid, e):
			return acl, false, nil
		case a.flags()&aceInherited != 0:
			inherited = append(inherited, a)
		case a.typ() == aceTypeDenied:
			deny = append(deny, a)
		default:
			allow = append(allow, a)
		}
	}
	if n := newEntry(sid, e); n.typ() == aceTypeDenied {
		deny = append(deny, n)
	} else {
		allow = append(allow, n)
	}
	return buildACL(append(append(deny, allow...), inherited...)), true, nil
}

// aclRemove returns the list acl without the entries, not inherited,
// that are e for sid, and whether there were any.
func aclRemove(acl, sid []byte, e ace) ([]byte, bool, error) {
	es, err := parseACL(acl)
	if err != nil {
		return nil, false, err
	}
	kept := es[:0:0]
	for _, a := range es {
		if !a.matches(sid, e) {
			kept = append(kept, a)
		}
	}
	if len(kept) == len(es) {
		return acl, false, nil
	}
	return buildACL(kept), true, nil
}
