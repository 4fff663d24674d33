// Package service holds the tests of the installed service under a
// real service manager: each test boots a systemd, as PID 1 of a
// container this machine makes (systemd-nspawn over a minimal Debian
// root made by debootstrap), with logind, a user manager and a normal
// user account, ada, and runs metnos-agent's install, status and
// uninstall there as ada would, against the project's reference server
// on the host's loopback (the container shares the host's network).
//
// The tests need root, systemd-nspawn and the root filesystem named by
// METNOS_SERVICE_ROOTFS, which .ci/service-rootfs makes (and .ci/run
// caches between runs). Without them they skip, saying which is
// missing; METNOS_REQUIRE_SANDBOX=1 makes that a failure.
//
// Each test boots its own container over an overlay of that root
// filesystem, so nothing a test does reaches the cache or another test.
// What runs in the container as ada is started by nsenter (the test's
// commands: install, status, systemctl --user), while the agent itself
// is started by ada's systemd user manager, under the container's own
// cgroups and system call filter, as on a laptop. Logging in is
// modelled by starting user@1000.service, which is what logind does at
// a login.
package service
