//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// killGroupOnCancel runs cmd in a process group of its own and makes
// cancelling its context kill the whole group. The go command starts test
// binaries of its own, and killing only the go command would leave them
// running (and writing into directories about to be removed) after an
// interrupt. A group of its own also keeps a terminal's ^C from reaching
// them before the tool has decided what to do.
func killGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
