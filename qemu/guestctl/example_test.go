package guestctl_test

import (
	"context"
	"log"
	"time"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
)

// An in-guest test on VM 0 publishes its QP number and waits for VM 1's.
func Example() {
	c, err := guestctl.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Put("qpn/0", "17"); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peer, err := c.Get(ctx, "qpn/1")
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("peer QP %s", peer)
}
