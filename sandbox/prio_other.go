//go:build !linux && !windows && !darwin

package sandbox

// ProbePriority says what this machine gives a run's priority: nothing,
// there is no backend here.
func ProbePriority(Options) PriorityCaps { return PriorityCaps{} }
