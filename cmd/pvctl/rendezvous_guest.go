//go:build guest

package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// This file is the bench's side of --vm, built only into the pvctl the
// bench builds for its guests (guest.BuildProgram passes the guest tag).

// openRendezvous opens the guest's control channel to the bench's host
// runner, whose key/value store is the rendezvous, and returns this VM's
// index in the run.
func openRendezvous() (rendezvous, int, error) {
	vm, err := strconv.Atoi(os.Getenv(proto.EnvVM))
	if err != nil {
		return nil, 0, fmt.Errorf("--vm: %s is not set: run inside the bench (pvvm -vms 2)", proto.EnvVM)
	}
	c, err := guestctl.Open()
	if err != nil {
		return nil, 0, err
	}
	return c, vm, nil
}
