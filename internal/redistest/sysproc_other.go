//go:build !linux

package redistest

import "os/exec"

// setSysProcAttr does nothing: only Linux can tie a child's life to its
// parent's.
func setSysProcAttr(cmd *exec.Cmd) {}
