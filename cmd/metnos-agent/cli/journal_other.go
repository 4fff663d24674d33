//go:build !linux

package cli

import "os"

// isJournalStream reports false: only Linux has the journal.
func isJournalStream(*os.File, string) bool { return false }
