// Package e2e runs metnos-agent as a real process against the Go
// reference server over loopback sockets: pairing, execution, crashes
// (kill -9 at the points that matter), tampering, deadlines, revocation
// and results too big for the server.
package e2e
