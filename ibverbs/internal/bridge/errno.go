package bridge

import (
	"context"
	"errors"
	"syscall"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/vfio"
)

// ErrUnsupported marks what the drop-in does not do (EOPNOTSUPP).
var ErrUnsupported = errors.New("ibverbs: not supported by the vfrdma drop-in")

// errInvalid marks an argument the verbs refuse (EINVAL).
var errInvalid = errors.New("ibverbs: invalid argument")

// Errno returns the errno value rdma-core's providers give for err: 0 for
// nil; EINVAL for a bad argument, a wrong QP state, a bad key or too many
// SGEs (providers refuse those at post with EINVAL); ENOMEM for a full
// queue (as providers report a work queue overflow) and for memory that
// cannot be pinned; EBUSY for a device another process holds or an object
// still in use; EOPNOTSUPP for what the device or the drop-in does not do;
// ENODEV for a closed object; ETIMEDOUT for a device command that timed
// out; an errno the error carries; EIO for anything else (a device fault).
func Errno(err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, vfrdma.ErrQueueFull), errors.Is(err, vfrdma.ErrMemlock):
		return syscall.ENOMEM
	case errors.Is(err, vfrdma.ErrInvalid), errors.Is(err, errInvalid), errors.Is(err, vfrdma.ErrQPState),
		errors.Is(err, vfrdma.ErrPrivileges), errors.Is(err, vfrdma.ErrProtection):
		return syscall.EINVAL
	case errors.Is(err, vfio.ErrBusy), errors.Is(err, vfrdma.ErrBusy):
		return syscall.EBUSY
	case errors.Is(err, vfrdma.ErrNotSupported), errors.Is(err, ErrUnsupported):
		return syscall.EOPNOTSUPP
	case errors.Is(err, vfrdma.ErrClosed):
		return syscall.ENODEV
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, vfrdma.ErrDeviceFault):
		return syscall.EIO
	}
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}
