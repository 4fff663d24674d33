// Package tailnet runs metnos-agent over a real tailnet on loopback: an
// in-process control server (tailscale's testcontrol), DERP and STUN,
// the reference server on a tsnet node, and the agent's own embedded
// node, all inside a network namespace that holds only loopback.
package tailnet
