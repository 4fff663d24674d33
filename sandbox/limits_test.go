package sandbox

import "testing"

// TestLimitsFor: zero fields are unset and take the backend's default;
// a set field is kept as it is, whatever its value (on Windows
// "exec --memory 1G" is 1 GiB, not the 512 MiB default).
func TestLimitsFor(t *testing.T) {
	d := DefaultLimits()
	for _, tc := range []struct {
		name  string
		goos  string
		l     Limits
		mem   int64
		procs int
	}{
		{"windows unset", "windows", Limits{}, 512 << 20, 8},
		{"windows --memory 1G", "windows", Limits{MemoryBytes: 1 << 30}, 1 << 30, 8},
		{"windows --memory 300M", "windows", Limits{MemoryBytes: 300 << 20}, 300 << 20, 8},
		{"windows --memory 2G", "windows", Limits{MemoryBytes: 2 << 30}, 2 << 30, 8},
		{"windows more procs", "windows", Limits{MaxProcs: 64}, 512 << 20, 8},
		{"windows fewer procs", "windows", Limits{MaxProcs: 3}, 512 << 20, 3},
		{"linux unset", "linux", Limits{}, 1 << 30, 64},
		{"linux --memory 1G", "linux", Limits{MemoryBytes: 1 << 30}, 1 << 30, 64},
		{"linux --memory 300M", "linux", Limits{MemoryBytes: 300 << 20, MaxProcs: 3}, 300 << 20, 3},
		{"darwin unset", "darwin", Limits{}, 1 << 30, 64},
	} {
		got := limitsFor(tc.goos, tc.l)
		if got.MemoryBytes != tc.mem || got.MaxProcs != tc.procs {
			t.Errorf("%s: memory %d procs %d, want %d %d", tc.name, got.MemoryBytes, got.MaxProcs, tc.mem, tc.procs)
		}
		if got.Timeout != d.Timeout || got.OutputBytes != d.OutputBytes || got.FileBytes != d.FileBytes {
			t.Errorf("%s: %+v, want the default timeout, output and file size", tc.name, got)
		}
		if tc.goos == "windows" {
			jl := jobLimitsFor(got)
			if jl.memory != uint64(tc.mem) || jl.processes != uint32(tc.procs) {
				t.Errorf("%s: job limits %+v, want memory %d processes %d", tc.name, jl, tc.mem, tc.procs)
			}
		}
	}
	// DefaultLimits is a fresh value: changing one changes no other.
	a := DefaultLimits()
	a.MemoryBytes = 1
	if DefaultLimits().MemoryBytes != 1<<30 {
		t.Errorf("DefaultLimits shares its value")
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		1:         "1 byte",
		512:       "512 bytes",
		64 << 10:  "64 KiB",
		1500:      "1500 bytes",
		1 << 20:   "1 MiB",
		96 << 20:  "96 MiB",
		3 << 19:   "1.5 MiB",
		1 << 30:   "1024 MiB",
		512 << 20: "512 MiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
