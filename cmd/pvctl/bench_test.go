package main

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A window larger than the queue, or negative, is refused before the
// device is touched.
func TestBenchRefusesABadWindow(t *testing.T) {
	for _, w := range []string{"513", "-1"} {
		e, out, _ := testEnv(t)
		err := cmdBench(e, []string{"--window", w})
		require.Error(t, err, "--window %s", w)
		assert.Contains(t, err.Error(), "--window "+w)
		assert.Empty(t, out.String())
	}
}

// A dial to a peer still starting is tried again: refused, or its host not
// reachable yet (ARP unanswered on a busy bench); other failures are not.
func TestDialRetriesAPeerStillStarting(t *testing.T) {
	wrap := func(e error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: e}}
	}
	for _, e := range []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT} {
		assert.True(t, dialRetriable(wrap(e)), "%v", e)
	}
	for _, e := range []error{syscall.EACCES, syscall.EADDRNOTAVAIL} {
		assert.False(t, dialRetriable(wrap(e)), "%v", e)
	}
	assert.False(t, dialRetriable(errors.New("no such host")))
}
