package connect

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A dial that a peer still starting explains is tried again: refused,
// its host or network not reachable yet (ARP unanswered on a busy bench),
// timed out, a temporary DNS failure; other failures are not.
func TestNotUpYetIsAPeerStillStarting(t *testing.T) {
	wrap := func(e error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: e}}
	}
	for _, e := range []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT} {
		assert.True(t, notUpYet(wrap(e)), "%v", e)
	}
	assert.True(t, notUpYet(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "server misbehaving", IsTemporary: true}}))
	assert.True(t, notUpYet(&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}), "an attempt that timed out")
	for _, e := range []error{syscall.EACCES, syscall.EADDRNOTAVAIL} {
		assert.False(t, notUpYet(wrap(e)), "%v", e)
	}
	assert.False(t, notUpYet(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", IsNotFound: true}}))
	assert.False(t, notUpYet(errors.New("no such host")))
}
