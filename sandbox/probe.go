package sandbox

// Caps is what this machine offers the sandbox, as probed once per
// process (bwrap is run once to see whether its namespaces work here).
type Caps struct {
	OS string `json:"os"`
	// Bwrap is the bubblewrap binary found on PATH, empty if none.
	Bwrap        string `json:"bwrap,omitempty"`
	BwrapVersion string `json:"bwrap_version,omitempty"`
	// BwrapUsable is true when a probe run with every namespace the
	// sandbox uses (user, pid, net, ipc, uts) succeeded.
	BwrapUsable bool `json:"bwrap_usable"`
	// BwrapError is why bwrap is not usable.
	BwrapError string `json:"bwrap_error,omitempty"`
	// LandlockABI is the kernel's Landlock ABI, 0 without Landlock.
	LandlockABI int `json:"landlock_abi"`
	// LandlockPinned is the ABI the shim is written against.
	LandlockPinned int `json:"landlock_pinned"`
	// Seccomp is true when seccomp filters can be installed.
	Seccomp bool `json:"seccomp"`
	// Cgroup describes cgroup v2 delegation ("" when none is usable)
	// and CgroupNote why not.
	Cgroup     string `json:"cgroup,omitempty"`
	CgroupNote string `json:"cgroup_note,omitempty"`
	// Disabled is Options.Disabled: why every layer is off.
	Disabled string `json:"disabled,omitempty"`
	// AppContainer is true on Windows when runs can start in this
	// device's AppContainer: its profile exists or was created, and a
	// process started in it was checked to be in one.
	// AppContainerNote says why not (an old Windows, a policy that
	// forbids profiles, Wine, the owner's METNOS_SANDBOX_APPCONTAINER=0).
	AppContainer     bool   `json:"appcontainer,omitempty"`
	AppContainerNote string `json:"appcontainer_note,omitempty"`
	// LowIntegrity is true on Windows when runs can start with a
	// restricted token at low integrity, checked the same way;
	// LowIntegrityNote says why not.
	LowIntegrity     bool   `json:"low_integrity,omitempty"`
	LowIntegrityNote string `json:"low_integrity_note,omitempty"`
}
