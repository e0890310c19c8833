//go:build !unix

package main

import "os/exec"

// killGroupOnCancel leaves cmd as it is where process groups do not exist:
// cancelling kills the go command alone.
func killGroupOnCancel(*exec.Cmd) {}
