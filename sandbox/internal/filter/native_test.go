//go:build linux

package filter

import (
	"bytes"
	"fmt"
	"go/format"
	"os"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"

	"github.com/metnos/agent/sandbox/internal/filter/names"
	"github.com/metnos/agent/sandbox/shim"
)

// nativeArches are the architectures whose name filter and syscall
// numbers are kept assembled, in native_<arch>.go, so that the agent
// need not link go-seccomp-bpf: the release builds' Linux ones.
var nativeArches = []string{"amd64", "arm64"}

// TestNativeTables checks native_amd64.go and native_arm64.go against
// what go-seccomp-bpf makes of package names' lists now, on any host:
// the architecture, every syscall number, and each variant of the name
// filter and the listen filter instruction for instruction. With
// -update it writes them again (review the diff: it is the filter every
// run gets). On the host's architecture it also checks what the package
// uses against the library directly.
func TestNativeTables(t *testing.T) {
	for _, goarch := range nativeArches {
		want, err := nativeSource(goarch)
		if err != nil {
			t.Fatal(err)
		}
		file := "native_" + goarch + ".go"
		if *update {
			if err := os.WriteFile(file, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what go-seccomp-bpf assembles from package names' lists: review the change and run go test ./sandbox/internal/filter -update", file)
		}
	}
	info, err := names.Info()
	if err != nil {
		t.Skipf("go-seccomp-bpf knows no %s: %v", runtime.GOARCH, err)
	}
	if id, err := auditArch(); err != nil || id != uint32(info.ID) {
		t.Errorf("auditArch() = %#x, %v; want %#x", id, err, uint32(info.ID))
	}
	for name, nr := range info.SyscallNames {
		if got, ok := syscallNr(name); !ok || got != uint32(nr) {
			t.Errorf("syscallNr(%q) = %d, %v; want %d", name, got, ok, nr)
		}
	}
	if _, ok := syscallNr("no_such_call"); ok {
		t.Error("syscallNr knows a call that does not exist")
	}
	if want, err := libraryListenProgram(info); err != nil {
		t.Fatal(err)
	} else if got, err := listenProgram(); err != nil || !slices.Equal(got, want) {
		t.Errorf("listenProgram() differs from go-seccomp-bpf's (%v)", err)
	}
	for _, metadata := range []bool{false, true} {
		for _, hostPIDs := range []bool{false, true} {
			want, err := libraryNameProgram(info, metadata, hostPIDs)
			if err != nil {
				t.Fatal(err)
			}
			got, err := nameProgram(metadata, hostPIDs)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("nameProgram(metadata %v, hostPIDs %v) differs from go-seccomp-bpf's", metadata, hostPIDs)
			}
		}
	}
}

// assembleFor assembles pol for the architecture info, as
// go-seccomp-bpf does on that architecture: the library takes it from
// runtime.GOARCH, into a field of Policy it does not export, which is
// all that differs (the syscall numbers, the audit value, the x32
// check on x86_64).
func assembleFor(pol seccomp.Policy, info *arch.Info) ([]bpf.RawInstruction, error) {
	f := reflect.ValueOf(&pol).Elem().FieldByName("arch")
	if !f.IsValid() || f.Type() != reflect.TypeOf(info) {
		return nil, fmt.Errorf("go-seccomp-bpf's Policy has no arch field of type %T to assemble for %s", info, info.Name)
	}
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(info))
	prog, err := pol.Assemble()
	if err != nil {
		return nil, err
	}
	return bpf.Assemble(prog)
}

// libraryNameProgram is the name filter for info as go-seccomp-bpf
// assembles it.
func libraryNameProgram(info *arch.Info, metadata, hostPIDs bool) ([]bpf.RawInstruction, error) {
	return assembleFor(names.PolicyFor(info, metadata, hostPIDs), info)
}

// libraryListenProgram is the listen filter for info as go-seccomp-bpf
// assembles it.
func libraryListenProgram(info *arch.Info) ([]bpf.RawInstruction, error) {
	return assembleFor(names.ListenPolicy(shim.ProxyListenFD, shim.ProxyBacklog), info)
}

// TestAssembleFor: assembling for the host's architecture through
// assembleFor gives what the library gives by itself.
func TestAssembleFor(t *testing.T) {
	info, err := names.Info()
	if err != nil {
		t.Skip(err)
	}
	pol, err := names.Policy(true, true)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := pol.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	want, err := bpf.Assemble(prog)
	if err != nil {
		t.Fatal(err)
	}
	got, err := libraryNameProgram(info, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Error("assembleFor(host) differs from the library's own assembly")
	}
}

// nativeSource is native_<goarch>.go as go-seccomp-bpf's tables and
// package names' lists make it.
func nativeSource(goarch string) ([]byte, error) {
	info, err := arch.GetInfo(goarch)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `// Code generated by TestNativeTables (go test ./sandbox/internal/filter -update); DO NOT EDIT.

//go:build linux && %s

package filter

import "golang.org/x/net/bpf"

// The name filter and the syscall numbers on %s, kept assembled from
// go-seccomp-bpf's tables and package names' lists (TestNativeTables
// checks them against both), so that the agent does not link
// go-seccomp-bpf, whose tables of every architecture are built at
// every start of a program that links them.

// auditArch is this architecture's AUDIT_ARCH_* value, as seccomp_data
// carries it.
func auditArch() (uint32, error) { return nativeArch, nil }

`, goarch, goarch)
	fmt.Fprintf(&b, "const nativeArch = %#x\n\n", uint32(info.ID))
	b.WriteString("// syscallNr is the number of the syscall name on this architecture;\n// false where it has none.\nfunc syscallNr(name string) (uint32, bool) {\n\tswitch name {\n")
	var ns []string
	for n := range info.SyscallNames {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	for _, n := range ns {
		fmt.Fprintf(&b, "\tcase %q:\n\t\treturn %d, true\n", n, info.SyscallNames[n])
	}
	b.WriteString("\t}\n\treturn 0, false\n}\n\n")
	b.WriteString("// nameProgram is the name filter (names.Policy), assembled.\nfunc nameProgram(metadata, hostPIDs bool) ([]bpf.RawInstruction, error) {\n\treturn nativeNames[b2i(metadata)][b2i(hostPIDs)], nil\n}\n\n")
	b.WriteString("func b2i(b bool) int {\n\tif b {\n\t\treturn 1\n\t}\n\treturn 0\n}\n\n")
	b.WriteString("// nativeNames is the name filter by [metadata][hostPIDs].\nvar nativeNames = [2][2][]bpf.RawInstruction{\n")
	for _, metadata := range []bool{false, true} {
		b.WriteString("\t{\n")
		for _, hostPIDs := range []bool{false, true} {
			raw, err := libraryNameProgram(info, metadata, hostPIDs)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(&b, "\t\t{ // metadata %v, hostPIDs %v\n", metadata, hostPIDs)
			for _, r := range raw {
				fmt.Fprintf(&b, "\t\t\t{Op: %#x, Jt: %d, Jf: %d, K: %#x},\n", r.Op, r.Jt, r.Jf, r.K)
			}
			b.WriteString("\t\t},\n")
		}
		b.WriteString("\t},\n")
	}
	b.WriteString("}\n\n")
	listen, err := libraryListenProgram(info)
	if err != nil {
		return nil, err
	}
	b.WriteString("// listenProgram is names.ListenPolicy for the shim's egress proxy\n// socket, assembled.\nfunc listenProgram() ([]bpf.RawInstruction, error) { return nativeListen, nil }\n\n")
	fmt.Fprintf(&b, "// nativeListen is names.ListenPolicy(%d, %d).\nvar nativeListen = []bpf.RawInstruction{\n", shim.ProxyListenFD, shim.ProxyBacklog)
	for _, r := range listen {
		fmt.Fprintf(&b, "\t{Op: %#x, Jt: %d, Jf: %d, K: %#x},\n", r.Op, r.Jt, r.Jf, r.K)
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}
