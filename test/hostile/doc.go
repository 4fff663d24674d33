// Package hostile holds the hostile test suite of the sandbox: every test
// runs an attack both directly on the host, where it must succeed (so that
// the test cannot pass vacuously), and through sandbox.Run, where it must
// fail. The suite needs no setup beyond being run as root or as an
// unprivileged user; set METNOS_REQUIRE_SANDBOX=1 to turn a missing
// sandbox layer into a failure instead of a skip.
package hostile
