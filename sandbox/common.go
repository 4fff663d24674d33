package sandbox

import (
	"io"
	"os"
	"strings"
)

// The small helpers every backend shares.

// setEnv returns env with key set to val, every other entry kept.
func setEnv(env []string, key, val string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+val)
}

// capped keeps the first limit bytes written and notes whether any were
// dropped; it never fails.
type capped struct {
	limit   int
	buf     []byte
	dropped bool
}

func (c *capped) Write(b []byte) (int, error) {
	if room := c.limit - len(c.buf); room > 0 {
		if len(b) <= room {
			c.buf = append(c.buf, b...)
			return len(b), nil
		}
		c.buf = append(c.buf, b[:room]...)
	}
	if len(b) > 0 {
		c.dropped = true
	}
	return len(b), nil
}

// stdinFor is what a command gets as its standard input for r. A pipe
// (or FIFO) is handed to it as its descriptor 0, so that nothing is read
// ahead or held in memory; it can only read it. Any other file is
// copied to it through a pipe instead, as it reads: handed as it is, a
// regular file opened for writing (`<>`) would let it write where its
// policy grants nothing, a directory would be a base for openat outside
// the sandbox's view, a socket a channel to the network. A directory is
// an empty input. Other readers are copied by os/exec already.
func stdinFor(r io.Reader) io.Reader {
	f, ok := r.(*os.File)
	if !ok {
		return r
	}
	if f == nil {
		return nil
	}
	fi, err := f.Stat()
	switch {
	case err == nil && fi.Mode()&os.ModeNamedPipe != 0:
		return f
	case err == nil && fi.IsDir():
		return nil
	}
	return struct{ io.Reader }{f}
}

// hostPIDsShared is what a run of a Policy with HostPIDs says in its
// Reason on Linux (and so in the result's sandbox_downgrade_reason): the
// sandbox word stays that of its layers, and this says what it shares.
const hostPIDsShared = "shares the host's PID namespace (system:read processes): sees every process's command line and status; " +
	"cannot read their environment or memory, nor signal them"

// hostNetViewShared is what a run of a Policy with HostNetView (and the
// network cut) says in its Reason on Linux.
const hostNetViewShared = "shares the host's network namespace read-only (system:read network_interfaces): sees its interfaces, addresses and routes; " +
	"cannot open an internet or packet socket, nor connect or bind"

// joinReason appends more to a Reason, "; "-separated.
func joinReason(reason, more string) string {
	if reason == "" {
		return more
	}
	return reason + "; " + more
}
