// Package refserver is a reference implementation of the server side of
// the Metnos device protocol (docs/protocol.md), written in Go
// for tests and demos. It is NOT a Metnos server: it has no policy, no
// users, no persistence and no TLS; all state lives in memory and is lost
// when the process ends, and nothing here should face a network you do
// not trust.
//
// What it does reproduce, byte for byte where the protocol cares, is
// what a device sees: pairing tokens and POST /agent/register (docs/protocol.md §4),
// signed long-poll delivery with re-delivery of orphans (docs/protocol.md §5.2–§5.3),
// heartbeats (docs/protocol.md §5.4), first-result-wins result intake (docs/protocol.md §5.5), signed
// executor bundles and shim (docs/protocol.md §5.6–§5.7), the signed Python runtime
// descriptor and ranged downloads (docs/protocol.md §11), and undo of device effects
// translated into ordinary invocations as Metnos does (docs/protocol.md §10.1),
// and, from a client mirror directory ([Config.Mirror], written by
// [Publish]), server_client_version, the signed update descriptors and the
// builds, and join sessions with their installer endpoint
// (docs/publishing.md).
//
// Executors and the shim are signed at load time from folders, the way
// Metnos's `sign.py sign` does it, with the server's Ed25519 "author"
// key; tests can then swap served bytes to simulate tampering.
//
// Every message, path and constant it shares with the device comes from
// package wire; it imports no device code (agent, client, sandbox, undo,
// audit, fetch, pairing, platform), so a device test may import it.
//
// A [Server] is driven from Go ([Server.IssueToken], [Server.Enqueue],
// [Server.Wait], [Server.Undo] …) or through the loopback-only admin API
// of [Server.AdminHandler], which the metnos-refserver command exposes.
package refserver
