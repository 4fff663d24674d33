//go:build !windows

package sandbox

import "log/slog"

// RecoverGrants removes the access entries that Windows runs cut short
// left for this device's AppContainer; there are none on this system.
func RecoverGrants(Options, *slog.Logger) (int, error) { return 0, nil }

// DeleteContainerProfile removes this device's AppContainer profile on
// Windows; there is none on this system.
func DeleteContainerProfile(Options) error { return nil }
