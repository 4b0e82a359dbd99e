package redistest

import (
	"os/exec"
	"syscall"
)

// setSysProcAttr makes the kernel kill the server if the test process dies
// without stopping it, say on a test timeout.
func setSysProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
