package firmware

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		s     Status
		errno syscall.Errno
		is    error
	}{
		{0xFFFFFFEA, syscall.EINVAL, syscall.EINVAL},
		{0xFFFFFFF4, syscall.ENOMEM, syscall.ENOMEM},
		{0xFFFFFFFB, syscall.EIO, syscall.EIO},
		{0xFFFFFFFF, syscall.EPERM, syscall.EPERM},
		{12, syscall.ENOMEM, syscall.ENOMEM},
		{0xFFFF, 0, ErrNotSupported},
		{0x80000000, 0, ErrDeviceFault},
		{4096, 0, ErrDeviceFault},
	} {
		assert.Equal(t, tc.errno, tc.s.Errno(), "%s", tc.s)
		assert.ErrorIs(t, tc.s.err(), tc.is, "%s", tc.s)
	}
}
