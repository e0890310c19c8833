//go:build !guest

package main

import "errors"

// openRendezvous: --vm needs the bench's rendezvous, which only the pvctl
// the bench builds for its guests has (rendezvous_guest.go).
func openRendezvous() (rendezvous, int, error) {
	return nil, 0, errors.New("--vm: this pvctl was not built for the bench's guests, which provide the rendezvous between VMs " +
		"(run it there with `go run ./cmd/pvvm -vms 2 -- ... --vm`); between two machines use --listen and --connect")
}
