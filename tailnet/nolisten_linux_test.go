//go:build linux

package tailnet

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/sandbox/shim"
)

// noListenHelper is the environment variable that turns this test
// binary into TestDenyListen's helper: DenyListen is for good, so it is
// tried in a process of its own.
const noListenHelper = "METNOS_TEST_NOLISTEN"

func init() {
	if os.Getenv(noListenHelper) == "" {
		return
	}
	// Before: a listener works. After: only the sandbox shim's proxy
	// socket (its descriptor number and backlog) may listen.
	fmt.Println("before", tryListen(-1, 128))
	if err := DenyListen(); err != nil {
		fmt.Println("DenyListen", err)
		os.Exit(1)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		l.Close()
	}
	fmt.Println("go-listener", errWord(err))
	fmt.Println("proxy-socket", tryListen(shim.ProxyListenFD, shim.ProxyBacklog))
	fmt.Println("proxy-fd-other-backlog", tryListen(shim.ProxyListenFD, 128))
	fmt.Println("other-fd-proxy-backlog", tryListen(-1, shim.ProxyBacklog))
	os.Exit(0)
}

// tryListen binds a TCP socket to 127.0.0.1 (at descriptor fd, unless
// -1) and listens with backlog.
func tryListen(fd, backlog int) string {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return errWord(err)
	}
	if fd >= 0 {
		if err := unix.Dup3(s, fd, unix.O_CLOEXEC); err != nil {
			return errWord(err)
		}
		unix.Close(s)
		s = fd
	}
	defer unix.Close(s)
	if err := unix.Bind(s, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return errWord(err)
	}
	return errWord(unix.Listen(s, backlog))
}

func errWord(err error) string {
	if err == nil {
		return "ok"
	}
	if strings.Contains(err.Error(), "operation not permitted") {
		return "EPERM"
	}
	return err.Error()
}

// TestDenyListen: after DenyListen nothing listens (Go's listeners
// included) but the sandbox shim's egress proxy socket, recognised by
// its descriptor number and backlog together.
func TestDenyListen(t *testing.T) {
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), noListenHelper+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	want := "before ok\ngo-listener EPERM\nproxy-socket ok\nproxy-fd-other-backlog EPERM\nother-fd-proxy-backlog EPERM\n"
	if string(out) != want {
		t.Errorf("helper printed\n%s\nwant\n%s", out, want)
	}
}
