package sandbox

import "strings"

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
