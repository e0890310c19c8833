package main

import (
	"fmt"

	"github.com/vfrdma/vfrdma/connect"
)

// rdma-core's pingpong programs swap QP addresses in a text format of
// their own (package connect's RDMACore and RDMACoreSRQ formats speak it).
// What else pvctl must do as they do is here.
const (
	// rdmaCoreQKey is the qkey ibv_ud_pingpong gives its QP and sends to.
	rdmaCoreQKey = connect.RDMACoreQKey
	// rdmaCoreFill is the byte ibv_rc_pingpong and ibv_ud_pingpong fill
	// their buffers with; it is what a vfrdma end checks every received
	// byte against.
	rdmaCoreFill = 0x7b
)

// fillRdmaCore fills a message as rdma-core's pingpongs do.
func fillRdmaCore(b []byte, _ int) {
	for i := range b {
		b[i] = rdmaCoreFill
	}
}

// checkRdmaCore checks a message from an rdma-core pingpong, every byte.
func checkRdmaCore(b []byte, seq int) error {
	for i, v := range b {
		if v != rdmaCoreFill {
			return fmt.Errorf("iteration %d: byte %d is %#x, want %#x (rdma-core's fill)", seq, i, v, rdmaCoreFill)
		}
	}
	return nil
}
