package uapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Kernel opens and closes VFIO file descriptors and issues ioctls on them.
// Linux is the real implementation; tests substitute a fake kernel that
// hands out stand-in descriptors and interprets the same byte layouts.
type Kernel interface {
	// Open opens a VFIO character device (the container device, a group,
	// a device cdev, or /dev/iommu) read-write and close-on-exec.
	Open(path string) (int, error)
	// Close closes a descriptor obtained from Open or from an ioctl that
	// returns one (VFIO_GROUP_GET_DEVICE_FD).
	Close(fd int) error
	// Ioctl issues req on fd with a pointer to arg's first byte as the
	// argument (0 when arg is empty). The kernel may write into arg. It
	// returns the ioctl's non-negative result or the errno.
	Ioctl(fd int, req uint, arg []byte) (int, error)
	// IoctlInt issues req on fd with an integer argument.
	IoctlInt(fd int, req uint, arg uintptr) (int, error)
	// IoctlPtr is Ioctl for a request whose struct points at a second
	// buffer (IOMMU_IOAS_IOVA_RANGES' array): buf's address goes, as a
	// native-endian u64, at offset at of arg (0 when buf is empty). The
	// kernel may write into both.
	IoctlPtr(fd int, req uint, arg []byte, at int, buf []byte) (int, error)
}

// maxInfoSize bounds the info buffer a kernel may ask for through argsz.
// Real capability chains are a few hundred bytes.
const maxInfoSize = 64 << 10

func encode(v any) []byte {
	b := make([]byte, binary.Size(v))
	if _, err := binary.Encode(b, binary.NativeEndian, v); err != nil {
		panic(err) // fixed-size structs of this package always encode
	}
	return b
}

// Decode decodes the fixed struct at the start of b into v.
func Decode(b []byte, v any) error {
	_, err := binary.Decode(b, binary.NativeEndian, v)
	return err
}

// Encode returns v (a struct of this package) in its ABI layout.
func Encode(v any) []byte { return encode(v) }

// queryInfo issues an INFO request whose argument is a fixed struct followed
// by a capability chain. When the chain does not fit the kernel reports the
// size it needs in argsz (and sets no cap offset); the request is then
// repeated with a buffer of that size.
func queryInfo(k Kernel, fd int, req uint, fixed []byte) ([]byte, error) {
	buf := append([]byte(nil), fixed...)
	for range 4 {
		if _, err := k.Ioctl(fd, req, buf); err != nil {
			return nil, err
		}
		need := binary.NativeEndian.Uint32(buf)
		if int64(need) <= int64(len(buf)) {
			return buf, nil
		}
		if need > maxInfoSize {
			return nil, fmt.Errorf("vfio: kernel asks for a %d-byte info buffer (more than %d)", need, maxInfoSize)
		}
		buf = make([]byte, need)
		copy(buf, fixed)
		binary.NativeEndian.PutUint32(buf, need)
	}
	return nil, errors.New("vfio: info size kept growing")
}

// GetAPIVersion issues VFIO_GET_API_VERSION on a container fd.
func GetAPIVersion(k Kernel, container int) (int, error) {
	return k.Ioctl(container, IoctlGetAPIVersion, nil)
}

// CheckExtension issues VFIO_CHECK_EXTENSION on a container fd.
func CheckExtension(k Kernel, container int, ext uint32) (bool, error) {
	r, err := k.IoctlInt(container, IoctlCheckExtension, uintptr(ext))
	return r > 0, err
}

// SetIOMMU issues VFIO_SET_IOMMU on a container fd.
func SetIOMMU(k Kernel, container int, typ uint32) error {
	_, err := k.IoctlInt(container, IoctlSetIOMMU, uintptr(typ))
	return err
}

// IOMMUGetInfo issues VFIO_IOMMU_GET_INFO; it returns the fixed info and
// the whole buffer for ParseCaps (the first capability is at CapOffset when
// Flags has IOMMUInfoCaps).
func IOMMUGetInfo(k Kernel, container int) (IOMMUType1Info, []byte, error) {
	var info IOMMUType1Info
	buf, err := queryInfo(k, container, IoctlIOMMUGetInfo, encode(&IOMMUType1Info{Argsz: uint32(binary.Size(info))}))
	if err != nil {
		return info, nil, err
	}
	err = Decode(buf, &info)
	return info, buf, err
}

// IOMMUMapDMA issues VFIO_IOMMU_MAP_DMA mapping mem at iova with flags
// (DMAMapFlagRead|DMAMapFlagWrite). mem must not be Go heap memory.
func IOMMUMapDMA(k Kernel, container int, mem []byte, iova uint64, flags uint32) error {
	m := DMAMap{Flags: flags, Vaddr: Addr(mem), IOVA: iova, Size: uint64(len(mem))}
	m.Argsz = uint32(binary.Size(m))
	_, err := k.Ioctl(container, IoctlIOMMUMapDMA, encode(&m))
	runtime.KeepAlive(mem)
	return err
}

// IOMMUUnmapDMA issues VFIO_IOMMU_UNMAP_DMA and returns the number of bytes
// the kernel unmapped.
func IOMMUUnmapDMA(k Kernel, container int, iova, size uint64) (uint64, error) {
	u := DMAUnmap{IOVA: iova, Size: size}
	u.Argsz = uint32(binary.Size(u))
	b := encode(&u)
	if _, err := k.Ioctl(container, IoctlIOMMUUnmapDMA, b); err != nil {
		return 0, err
	}
	if err := Decode(b, &u); err != nil {
		return 0, err
	}
	return u.Size, nil
}

// GroupGetStatus issues VFIO_GROUP_GET_STATUS.
func GroupGetStatus(k Kernel, group int) (GroupStatus, error) {
	s := GroupStatus{Argsz: 8}
	b := encode(&s)
	if _, err := k.Ioctl(group, IoctlGroupGetStatus, b); err != nil {
		return s, err
	}
	err := Decode(b, &s)
	return s, err
}

// GroupSetContainer issues VFIO_GROUP_SET_CONTAINER.
func GroupSetContainer(k Kernel, group, container int) error {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, uint32(int32(container)))
	_, err := k.Ioctl(group, IoctlGroupSetContainer, b)
	return err
}

// GroupUnsetContainer issues VFIO_GROUP_UNSET_CONTAINER.
func GroupUnsetContainer(k Kernel, group int) error {
	_, err := k.Ioctl(group, IoctlGroupUnsetContainer, nil)
	return err
}

// GroupGetDeviceFD issues VFIO_GROUP_GET_DEVICE_FD for the named device (a
// PCI address such as "0000:00:10.1") and returns the new device fd.
func GroupGetDeviceFD(k Kernel, group int, name string) (int, error) {
	b := append([]byte(name), 0)
	return k.Ioctl(group, IoctlGroupGetDeviceFD, b)
}

// DeviceGetInfo issues VFIO_DEVICE_GET_INFO; it returns the fixed info and
// the whole buffer for ParseCaps.
func DeviceGetInfo(k Kernel, dev int) (DeviceInfo, []byte, error) {
	var info DeviceInfo
	buf, err := queryInfo(k, dev, IoctlDeviceGetInfo, encode(&DeviceInfo{Argsz: uint32(binary.Size(info))}))
	if err != nil {
		return info, nil, err
	}
	err = Decode(buf, &info)
	return info, buf, err
}

// DeviceGetRegionInfo issues VFIO_DEVICE_GET_REGION_INFO for one region; it
// returns the fixed info and the whole buffer for ParseCaps.
func DeviceGetRegionInfo(k Kernel, dev int, index uint32) (RegionInfo, []byte, error) {
	var info RegionInfo
	buf, err := queryInfo(k, dev, IoctlDeviceGetRegionInfo, encode(&RegionInfo{Argsz: uint32(binary.Size(info)), Index: index}))
	if err != nil {
		return info, nil, err
	}
	err = Decode(buf, &info)
	return info, buf, err
}

// DeviceGetIRQInfo issues VFIO_DEVICE_GET_IRQ_INFO for one IRQ index.
func DeviceGetIRQInfo(k Kernel, dev int, index uint32) (IRQInfo, error) {
	info := IRQInfo{Argsz: 16, Index: index}
	b := encode(&info)
	if _, err := k.Ioctl(dev, IoctlDeviceGetIRQInfo, b); err != nil {
		return info, err
	}
	err := Decode(b, &info)
	return info, err
}

// DeviceSetIRQs issues VFIO_DEVICE_SET_IRQS with data appended to the
// header (eventfds as s32, or bools as u8, per flags).
func DeviceSetIRQs(k Kernel, dev int, flags, index, start, count uint32, data []byte) error {
	s := IRQSet{Flags: flags, Index: index, Start: start, Count: count}
	s.Argsz = uint32(binary.Size(s) + len(data))
	b := append(encode(&s), data...)
	_, err := k.Ioctl(dev, IoctlDeviceSetIRQs, b)
	return err
}

// EventfdData encodes eventfds (or -1 to de-assign one) as SET_IRQS data.
func EventfdData(fds []int32) []byte {
	b := make([]byte, 4*len(fds))
	for i, fd := range fds {
		binary.NativeEndian.PutUint32(b[4*i:], uint32(fd))
	}
	return b
}

// DeviceReset issues VFIO_DEVICE_RESET.
func DeviceReset(k Kernel, dev int) error {
	_, err := k.Ioctl(dev, IoctlDeviceReset, nil)
	return err
}

// Linux is the Kernel that issues real ioctl system calls.
type Linux struct{}

var _ Kernel = Linux{}

// Open implements Kernel.
func (Linux) Open(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// Close implements Kernel.
func (Linux) Close(fd int) error { return unix.Close(fd) }

// IoctlInt implements Kernel.
func (Linux) IoctlInt(fd int, req uint, arg uintptr) (int, error) {
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), arg)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), nil
	}
}
