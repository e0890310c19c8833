//go:build linux && (mips || mipsle || mips64 || mips64le || ppc64 || ppc64le || sparc64)

package uapi

// MIPS, PowerPC and SPARC: _IOC_NONE is 1, 13 size bits put the direction at
// bit 29.
const (
	iocNone     = 1
	iocDirShift = 29
)
