package redistest

import (
	"os/exec"
	"syscall"
)

// setDeathSignal asks the kernel to kill the server when the test process
// dies, so a crashed or timed-out test leaves no redis-server behind.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
