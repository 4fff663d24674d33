package fspath

import "testing"

func TestWithinInside(t *testing.T) {
	for _, tc := range []struct {
		p, dir         string
		within, inside bool
	}{
		{"/a/b", "/a/b", true, false},
		{"/a/b/c", "/a/b", true, true},
		{"/a/bc", "/a/b", false, false},
		{"/a", "/a/b", false, false},
		{"/a/b/../c", "/a/b", false, false},
		{"/x", "/", true, true},
		{"/a/..b", "/a", true, true},
	} {
		if got := Within(tc.p, tc.dir); got != tc.within {
			t.Errorf("Within(%q, %q) = %v", tc.p, tc.dir, got)
		}
		if got := Inside(tc.p, tc.dir); got != tc.inside {
			t.Errorf("Inside(%q, %q) = %v", tc.p, tc.dir, got)
		}
	}
}
