//go:build !unix

package sandbox

import "os"

// writableByMode is not used outside Unix; it reports true so that
// placeholders err on the side of masking.
func writableByMode(fi os.FileInfo) bool { return true }
