package sandbox

import "github.com/metnos/agent/sandbox/internal/filter"

// ListenFilter is the seccomp filter that refuses listen(2) but on the
// shim's egress proxy socket (descriptor [shim.ProxyListenFD], backlog
// [shim.ProxyBacklog]), as raw struct sock_filter bytes in native byte
// order: what tailnet.DenyListen loads into the agent. It is assembled
// here, with the sandbox's own filters, so that the agent links one
// seccomp assembler, or none where the filters are kept assembled.
func ListenFilter() ([]byte, error) { return filter.ListenFilter() }
