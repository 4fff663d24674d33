package sandbox

import (
	"encoding/binary"
	"testing"
)

// testSIDBytes is a SID as bytes: S-1-<auth>-<subs...>.
func testSIDBytes(auth byte, subs ...uint32) []byte {
	b := []byte{1, byte(len(subs)), 0, 0, 0, 0, 0, auth}
	for _, s := range subs {
		b = binary.LittleEndian.AppendUint32(b, s)
	}
	return b
}

// TestACLEdits: entries are added in canonical order (explicit denies,
// explicit allows, inherited), found again, and removed, and no other
// entry (another SID's, an inherited one, one of the same SID with other
// rights) is ever changed.
func TestACLEdits(t *testing.T) {
	owner := testSIDBytes(5, 21, 1, 2, 3, 1000)
	other := testSIDBytes(5, 18)
	ours := testSIDBytes(15, 2, 1, 2, 3, 4, 5, 6, 7)
	inheritedAllow := newEntry(owner, ace{Rights: aceModify, Inherit: true})
	inheritedAllow[1] |= aceInherited
	acl := buildACL([]aclEntry{
		newEntry(other, ace{Rights: aceDeny}),
		newEntry(owner, ace{Rights: aceModify, Inherit: true}),
		inheritedAllow,
	})
	read := ace{Rights: aceRead, Inherit: true}
	deny := ace{Rights: aceDeny, Inherit: true}

	acl2, changed, err := aclAdd(acl, ours, read)
	if err != nil || !changed {
		t.Fatalf("add read: %v %v", changed, err)
	}
	acl3, changed, err := aclAdd(acl2, ours, deny)
	if err != nil || !changed {
		t.Fatalf("add deny: %v %v", changed, err)
	}
	es, err := parseACL(acl3)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		typ   byte
		sid   []byte
		inher bool
	}{{aceTypeDenied, other, false}, {aceTypeDenied, ours, false}, {aceTypeAllowed, owner, false}, {aceTypeAllowed, ours, false}, {aceTypeAllowed, owner, true}}
	if len(es) != len(want) {
		t.Fatalf("%d entries, want %d", len(es), len(want))
	}
	for i, w := range want {
		if es[i].typ() != w.typ || string(es[i].sid()) != string(w.sid) || (es[i].flags()&aceInherited != 0) != w.inher {
			t.Errorf("entry %d: type %d flags %#x, want type %d inherited %v", i, es[i].typ(), es[i].flags(), w.typ, w.inher)
		}
	}
	if es[3].mask() != maskRead || es[3].flags() != aceObjectInherit|aceContainerInherit || es[1].mask() != maskAll {
		t.Errorf("masks %#x %#x, flags %#x", es[3].mask(), es[1].mask(), es[3].flags())
	}
	// Adding it again changes nothing; it is found; other rights are not.
	if _, changed, _ := aclAdd(acl3, ours, read); changed {
		t.Error("added twice")
	}
	for _, c := range []struct {
		e    ace
		want bool
	}{{read, true}, {deny, true}, {ace{Rights: aceModify, Inherit: true}, false}, {ace{Rights: aceRead}, false}} {
		if on, _ := aclHas(acl3, ours, c.e); on != c.want {
			t.Errorf("has %+v: %v", c.e, on)
		}
	}
	// The owner's inherited modify is not "ours", nor an explicit one.
	if on, _ := aclHas(acl3, owner, ace{Rights: aceModify, Inherit: true}); !on {
		t.Error("the owner's explicit entry not found")
	}
	// Removing takes exactly ours, one at a time.
	acl4, changed, err := aclRemove(acl3, ours, read)
	if err != nil || !changed {
		t.Fatalf("remove: %v %v", changed, err)
	}
	acl5, _, _ := aclRemove(acl4, ours, deny)
	if string(acl5) != string(acl) {
		t.Errorf("after removing both, the list differs from the one before")
	}
	if _, changed, _ := aclRemove(acl5, ours, deny); changed {
		t.Error("removed what was not there")
	}
	// An inherited entry of our SID (from a grant on a parent) is never
	// removed from a child: only the parent's own goes.
	inh := newEntry(ours, read)
	inh[1] |= aceInherited
	withInh := buildACL([]aclEntry{inh})
	if _, changed, _ := aclRemove(withInh, ours, read); changed {
		t.Error("an inherited entry was removed")
	}
}

// TestACLMalformed: a list whose sizes lie is an error, not a guess.
func TestACLMalformed(t *testing.T) {
	good := buildACL([]aclEntry{newEntry(testSIDBytes(5, 18), ace{Rights: aceRead})})
	for name, b := range map[string][]byte{
		"short":      good[:6],
		"size lies":  append(append([]byte{}, good[:2]...), append([]byte{0xff, 0x00}, good[4:]...)...),
		"entry lies": append(append([]byte{}, good[:10]...), append([]byte{0xff, 0x00}, good[12:]...)...),
		"count lies": append(append([]byte{}, good[:4]...), append([]byte{5, 0}, good[6:]...)...),
	} {
		if _, err := parseACL(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
