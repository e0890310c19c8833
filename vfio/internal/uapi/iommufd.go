package uapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Device cdev requests (include/uapi/linux/vfio.h), issued on the fd of
// /dev/vfio/devices/vfioN. The other device requests (regions, IRQs,
// reset) are the group path's, on the same fd once it is bound.
const (
	IoctlDeviceBindIOMMUFD   = ioBase + 18 // VFIO_DEVICE_BIND_IOMMUFD: DeviceBindIOMMUFD
	IoctlDeviceAttachIOMMUFD = ioBase + 19 // VFIO_DEVICE_ATTACH_IOMMUFD_PT: DeviceAttachIOMMUFDPT
	IoctlDeviceDetachIOMMUFD = ioBase + 20 // VFIO_DEVICE_DETACH_IOMMUFD_PT: DeviceDetachIOMMUFDPT
)

// iommufd requests (include/uapi/linux/iommufd.h), issued on the fd of
// /dev/iommu. iommufd.h defines them as _IO(IOMMUFD_TYPE, IOMMUFD_CMD_*)
// with IOMMUFD_TYPE ';' (VFIO's type) and the commands from 0x80; like
// VFIO's, they encode no size and no direction.
const (
	iommufdCmdBase uint = 0x80
	iommufdBase         = iocNone<<iocDirShift | vfioType<<8 | iommufdCmdBase

	IoctlIOMMUDestroy   = iommufdBase + 0 // IOMMU_DESTROY: IOMMUDestroy
	IoctlIOASAlloc      = iommufdBase + 1 // IOMMU_IOAS_ALLOC: IOASAlloc
	IoctlIOASAllowIOVAs = iommufdBase + 2 // IOMMU_IOAS_ALLOW_IOVAS (not used)
	IoctlIOASCopy       = iommufdBase + 3 // IOMMU_IOAS_COPY (not used)
	IoctlIOASIOVARanges = iommufdBase + 4 // IOMMU_IOAS_IOVA_RANGES: IOASIOVARanges + an array of IOMMUIOVARange
	IoctlIOASMap        = iommufdBase + 5 // IOMMU_IOAS_MAP: IOASMap
	IoctlIOASUnmap      = iommufdBase + 6 // IOMMU_IOAS_UNMAP: IOASUnmap, length written back
	IoctlIOMMUOption    = iommufdBase + 7 // IOMMU_OPTION (not used)
	IoctlIOMMUVFIOIOAS  = iommufdBase + 8 // IOMMU_VFIO_IOAS (not used)
)

// IOASMap.Flags (enum iommufd_ioas_map_flags).
const (
	IOASMapFixedIOVA = 1 << 0 // IOMMU_IOAS_MAP_FIXED_IOVA: map at IOASMap.IOVA
	IOASMapWriteable = 1 << 1 // IOMMU_IOAS_MAP_WRITEABLE: the device may write
	IOASMapReadable  = 1 << 2 // IOMMU_IOAS_MAP_READABLE: the device may read
)

// DeviceBindIOMMUFD is struct vfio_device_bind_iommufd up to out_devid, its
// form since Linux 6.6 (the kernel's minimum size; later kernels append
// token_uuid_ptr, read only with VFIO_DEVICE_BIND_FLAG_TOKEN).
type DeviceBindIOMMUFD struct {
	Argsz    uint32
	Flags    uint32
	IOMMUFD  int32  // the iommufd to bind to
	OutDevID uint32 // out: the device's ID in that iommufd
}

// DeviceAttachIOMMUFDPT is struct vfio_device_attach_iommufd_pt up to
// pt_id (later kernels append pasid, read only with VFIO_DEVICE_ATTACH_PASID).
type DeviceAttachIOMMUFDPT struct {
	Argsz uint32
	Flags uint32
	PTID  uint32 // in: the IOAS (or HWPT) ID; out: the HWPT attached
}

// DeviceDetachIOMMUFDPT is struct vfio_device_detach_iommufd_pt up to flags
// (later kernels append pasid).
type DeviceDetachIOMMUFDPT struct {
	Argsz uint32
	Flags uint32
}

// IOMMUDestroy is struct iommu_destroy.
type IOMMUDestroy struct {
	Size uint32
	ID   uint32
}

// IOASAlloc is struct iommu_ioas_alloc.
type IOASAlloc struct {
	Size      uint32
	Flags     uint32
	OutIOASID uint32
}

// IOMMUIOVARange is struct iommu_iova_range; Last is inclusive.
type IOMMUIOVARange struct {
	Start uint64
	Last  uint64
}

// IOASIOVARanges is struct iommu_ioas_iova_ranges. AllowedIOVAs is the
// address of an array of NumIOVAs IOMMUIOVARange the kernel fills.
type IOASIOVARanges struct {
	Size             uint32
	IOASID           uint32
	NumIOVAs         uint32 // in: the array's length; out: the number of ranges
	Reserved         uint32
	AllowedIOVAs     uint64
	OutIOVAAlignment uint64
}

// IOASMap is struct iommu_ioas_map.
type IOASMap struct {
	Size     uint32
	Flags    uint32
	IOASID   uint32
	Reserved uint32
	UserVA   uint64
	Length   uint64
	IOVA     uint64
}

// IOASUnmap is struct iommu_ioas_unmap.
type IOASUnmap struct {
	Size   uint32
	IOASID uint32
	IOVA   uint64
	Length uint64 // in: bytes to unmap; out: bytes unmapped
}

// Offset of IOASIOVARanges.AllowedIOVAs, where IoctlPtr puts the array's
// address.
const ioasIOVARangesArrayAt = 16

// BindIOMMUFD issues VFIO_DEVICE_BIND_IOMMUFD on a device cdev fd and
// returns the device's ID in the iommufd.
func BindIOMMUFD(k Kernel, dev, iommufd int) (uint32, error) {
	b := DeviceBindIOMMUFD{IOMMUFD: int32(iommufd)}
	b.Argsz = uint32(binary.Size(b))
	arg := encode(&b)
	if _, err := k.Ioctl(dev, IoctlDeviceBindIOMMUFD, arg); err != nil {
		return 0, err
	}
	err := Decode(arg, &b)
	return b.OutDevID, err
}

// AttachIOMMUFDPT issues VFIO_DEVICE_ATTACH_IOMMUFD_PT attaching a bound
// device to the IOAS (or HWPT) pt; it returns the ID the kernel attached.
func AttachIOMMUFDPT(k Kernel, dev int, pt uint32) (uint32, error) {
	a := DeviceAttachIOMMUFDPT{PTID: pt}
	a.Argsz = uint32(binary.Size(a))
	arg := encode(&a)
	if _, err := k.Ioctl(dev, IoctlDeviceAttachIOMMUFD, arg); err != nil {
		return 0, err
	}
	err := Decode(arg, &a)
	return a.PTID, err
}

// DetachIOMMUFDPT issues VFIO_DEVICE_DETACH_IOMMUFD_PT.
func DetachIOMMUFDPT(k Kernel, dev int) error {
	d := DeviceDetachIOMMUFDPT{}
	d.Argsz = uint32(binary.Size(d))
	_, err := k.Ioctl(dev, IoctlDeviceDetachIOMMUFD, encode(&d))
	return err
}

// IOMMUDestroyObject issues IOMMU_DESTROY for object id.
func IOMMUDestroyObject(k Kernel, iommufd int, id uint32) error {
	d := IOMMUDestroy{ID: id}
	d.Size = uint32(binary.Size(d))
	_, err := k.Ioctl(iommufd, IoctlIOMMUDestroy, encode(&d))
	return err
}

// IOASAllocate issues IOMMU_IOAS_ALLOC and returns the new IOAS's ID.
func IOASAllocate(k Kernel, iommufd int) (uint32, error) {
	a := IOASAlloc{}
	a.Size = uint32(binary.Size(a))
	arg := encode(&a)
	if _, err := k.Ioctl(iommufd, IoctlIOASAlloc, arg); err != nil {
		return 0, err
	}
	err := Decode(arg, &a)
	return a.OutIOASID, err
}

// maxIOVARanges bounds the array IOASRanges asks the kernel to fill.
const maxIOVARanges = 4096

// IOASRanges issues IOMMU_IOAS_IOVA_RANGES and returns the IOAS's usable
// IOVA ranges (inclusive ends) and the alignment the kernel requires of a
// mapping's IOVA and length. The array starts with room for 8 ranges; when
// the kernel needs more it answers EMSGSIZE with the count, and the request
// is repeated once with that room.
func IOASRanges(k Kernel, iommufd int, ioas uint32) ([]IOMMUIOVARange, uint64, error) {
	n := uint32(8)
	for range 3 {
		r := IOASIOVARanges{IOASID: ioas, NumIOVAs: n}
		r.Size = uint32(binary.Size(r))
		arg := encode(&r)
		buf := make([]byte, int(n)*binary.Size(IOMMUIOVARange{}))
		_, err := k.IoctlPtr(iommufd, IoctlIOASIOVARanges, arg, ioasIOVARangesArrayAt, buf)
		if derr := Decode(arg, &r); derr != nil {
			return nil, 0, derr
		}
		if err != nil {
			if isEMSGSIZE(err) && r.NumIOVAs > n && r.NumIOVAs <= maxIOVARanges {
				n = r.NumIOVAs
				continue
			}
			return nil, 0, err
		}
		if r.NumIOVAs > n {
			return nil, 0, errRangesGrew
		}
		rs := make([]IOMMUIOVARange, r.NumIOVAs)
		for i := range rs {
			if err := Decode(buf[16*i:], &rs[i]); err != nil {
				return nil, 0, err
			}
		}
		return rs, r.OutIOVAAlignment, nil
	}
	return nil, 0, errRangesGrew
}

var errRangesGrew = fmt.Errorf("iommufd: IOMMU_IOAS_IOVA_RANGES kept reporting more ranges than it was given room for (at most %d)", maxIOVARanges)

func isEMSGSIZE(err error) bool { return errors.Is(err, unix.EMSGSIZE) }

// IOASMapFixed issues IOMMU_IOAS_MAP mapping mem at iova in the IOAS with
// IOASMapFixedIOVA and flags (IOASMapReadable|IOASMapWriteable). mem must
// not be Go heap memory.
func IOASMapFixed(k Kernel, iommufd int, ioas uint32, mem []byte, iova uint64, flags uint32) error {
	m := IOASMap{Flags: IOASMapFixedIOVA | flags, IOASID: ioas, UserVA: Addr(mem), Length: uint64(len(mem)), IOVA: iova}
	m.Size = uint32(binary.Size(m))
	_, err := k.Ioctl(iommufd, IoctlIOASMap, encode(&m))
	runtime.KeepAlive(mem)
	return err
}

// IOASUnmapRange issues IOMMU_IOAS_UNMAP and returns the number of bytes
// the kernel unmapped.
func IOASUnmapRange(k Kernel, iommufd int, ioas uint32, iova, length uint64) (uint64, error) {
	u := IOASUnmap{IOASID: ioas, IOVA: iova, Length: length}
	u.Size = uint32(binary.Size(u))
	arg := encode(&u)
	if _, err := k.Ioctl(iommufd, IoctlIOASUnmap, arg); err != nil {
		return 0, err
	}
	if err := Decode(arg, &u); err != nil {
		return 0, err
	}
	return u.Length, nil
}
