//go:build !linux

package redistest

import "os/exec"

// setDeathSignal does nothing where the kernel offers no parent-death
// signal; t.Cleanup still stops the servers.
func setDeathSignal(*exec.Cmd) {}
