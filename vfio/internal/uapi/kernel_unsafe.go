package uapi

import (
	"encoding/binary"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ioctl implements Kernel: arg's first byte is passed as the pointer
// argument.
func (Linux) Ioctl(fd int, req uint, arg []byte) (int, error) {
	var p unsafe.Pointer
	if len(arg) > 0 {
		p = unsafe.Pointer(unsafe.SliceData(arg))
	}
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(p))
		runtime.KeepAlive(arg)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), nil
	}
}

// IoctlPtr implements Kernel.
func (l Linux) IoctlPtr(fd int, req uint, arg []byte, at int, buf []byte) (int, error) {
	if at < 0 || at+8 > len(arg) {
		return -1, unix.EINVAL
	}
	binary.NativeEndian.PutUint64(arg[at:], Addr(buf))
	r, err := l.Ioctl(fd, req, arg)
	runtime.KeepAlive(buf)
	return r, err
}

// Addr returns the virtual address of b's first byte (0 for an empty
// slice), as the kernel's vaddr fields want it. It is meant for memory
// mapped outside the Go heap, whose address never changes.
func Addr(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
