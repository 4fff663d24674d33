// Package egress is the per-run egress proxy of issue 14: the one way out
// of a sandboxed run whose network is narrowed to the destinations its
// signed manifest names ([policy.Egress]). It runs in the agent process,
// outside the sandbox, one [Proxy] per run; the sandbox side (a unix
// socket bound into the run's empty network namespace and a relay
// inside it, HTTP_PROXY/HTTPS_PROXY/ALL_PROXY pointing at it) is not
// this package's.
//
// One listener speaks two protocols, told apart by the first byte: SOCKS5
// (RFC 1928, no authentication, CONNECT only) and HTTP/1.x (a forward
// proxy for http:// absolute URIs, and CONNECT for everything else,
// https:// included).
//
// What it guarantees:
//
//   - Every connection is decided by [policy.Egress.CheckName] on the host
//     and port the client names, then, names being resolved by the proxy
//     itself (Options.Resolver), by [policy.Egress.CheckAddr] on every
//     address before it is dialed. A name whose DNS answer points at a
//     loopback, private, link-local, CGNAT/tailnet or metadata address is
//     refused unless the pattern that allowed it names that address
//     literally (DNS rebinding); the client never connects to an address
//     the proxy did not check.
//   - An HTTP request must carry an absolute http:// URI whose authority
//     the Host header, when present, repeats; a CONNECT or SOCKS5 target
//     must be a plain host and port (no user information, '@', path or
//     spaces). Anything else is answered 400 and refused, so one request
//     cannot name two hosts.
//   - A refusal is answered at once: HTTP 403 with the header
//     X-Proxy-Error (blocked-by-allowlist, blocked-by-denylist or
//     blocked-by-address) and a one-line body naming the host and why;
//     SOCKS5 reply 0x02 (connection not allowed by ruleset).
//   - Every connection, allowed or refused, is recorded ([Proxy.Records]):
//     protocol, host, port, the address connected to, bytes each way, the
//     verdict and its reason; [Proxy.Refused] gives the count of refusals
//     and the first refused host for the run's result.
//   - A run holds at most Options.MaxConns connections at once; beyond
//     that new ones are refused at once (HTTP 503, SOCKS5 reply 0x01). A
//     client has 30 s to send a request head. Each run has its own Proxy,
//     so one run exhausting its own does not touch another's.
//
// What it does not do:
//
//   - No TLS interception: a CONNECT (https://) is checked by host and
//     port only; the proxy does not see the name in the TLS handshake or
//     the requests inside, so a server that answers for several names
//     behind one allowed name is reachable as that name.
//   - One request per HTTP client connection: the forwarded request and
//     its response carry "Connection: close" (clients open a new
//     connection for the next request); Upgrade (WebSocket over http://)
//     is not forwarded, though wss:// through CONNECT works.
//   - Programs that ignore the proxy variables cannot connect at all: the
//     run's network namespace has only a loopback, so a direct connect to
//     any outside address fails with "network is unreachable"
//     (ENETUNREACH), one to a loopback port nothing listens on with
//     "connection refused" (ECONNREFUSED) or, where Landlock's TCP rules
//     allow only the proxy's port, "permission denied" (EACCES); a name
//     lookup of their own fails ("Temporary failure in name resolution"
//     in Python) since no resolver is reachable. The proxy is not
//     transparent: a program must use HTTP_PROXY/HTTPS_PROXY/ALL_PROXY.
//   - No UDP (SOCKS5 UDP ASSOCIATE is refused), so no QUIC or DNS of the
//     executor's own.
package egress
