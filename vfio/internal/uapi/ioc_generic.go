//go:build linux && !(mips || mipsle || mips64 || mips64le || ppc64 || ppc64le || sparc64)

package uapi

// asm-generic/ioctl.h: _IOC_NONE is 0, the direction sits at bit 30.
const (
	iocNone     = 0
	iocDirShift = 30
)
