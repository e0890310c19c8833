package vfiotest

import (
	"encoding/binary"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// ioasAlignment is the IOVA alignment the fake's IOASes report.
const ioasAlignment = 4096

// openIOMMUFD opens /dev/iommu (mu held).
func (k *kernel) openIOMMUFD() (int, error) {
	if !k.iommufd {
		return -1, unix.ENOENT
	}
	fd, err := memfd("iommufd", 0)
	if err != nil {
		return -1, err
	}
	k.fds[fd] = &fakeFD{x: &ictx{fd: fd, ioass: map[uint32]*ioas{}}}
	return fd, nil
}

// openCDev opens /dev/vfio/devices/<node> (mu held). Opening succeeds for
// any registered device; the fd is refused every request but the bind.
func (k *kernel) openCDev(node string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(node, "vfio"))
	if err != nil || !strings.HasPrefix(node, "vfio") || n < 0 || n >= len(k.cdevs) {
		return -1, unix.ENOENT
	}
	d := k.cdevs[n]
	if d.g == nil || k.groups[d.g.n] != d.g {
		return -1, unix.ENOENT // its group was removed: not bound to vfio-pci
	}
	fd, err := d.memfd()
	if err != nil {
		return -1, err
	}
	k.fds[fd] = &fakeFD{d: d, cdev: true}
	return fd, nil
}

// unbind undoes a cdev's bind and attach, as closing its fd does (mu held).
func (k *kernel) unbind(f *fakeFD) {
	if f.ioas != nil {
		f.ioas.attached--
		f.ioas = nil
	}
	g := f.d.g
	g.owned--
	if g.owned == 0 {
		g.owner = nil
	}
	f.bound = nil
}

// ranges returns what IOMMU_IOAS_IOVA_RANGES reports for a: everything
// while no device is attached, the IOMMU's ranges once one is.
func (k *kernel) ranges(a *ioas) []vfio.IOVARange {
	if a.attached == 0 || k.iommu.Ranges == nil {
		return []vfio.IOVARange{{Start: 0, End: ^uint64(0)}}
	}
	return k.iommu.Ranges
}

func (k *kernel) iovaRanges(x *ictx, arg, buf []byte) (int, error) {
	var r uapi.IOASIOVARanges
	if err := uapi.Decode(arg, &r); err != nil || r.Size < 32 || r.Reserved != 0 {
		return -1, unix.EINVAL
	}
	a, ok := x.ioass[r.IOASID]
	if !ok {
		return -1, unix.ENOENT
	}
	if int(r.NumIOVAs)*16 > len(buf) {
		return -1, unix.EFAULT // the array the caller names is shorter than it says
	}
	rs := k.ranges(a)
	in := r.NumIOVAs
	r.NumIOVAs = uint32(len(rs))
	r.OutIOVAAlignment = ioasAlignment
	if k.ioasAlign != nil {
		r.OutIOVAAlignment = *k.ioasAlign
	}
	copy(arg, uapi.Encode(&r))
	if int(in) < len(rs) {
		return -1, unix.EMSGSIZE
	}
	for i, x := range rs {
		copy(buf[16*i:], uapi.Encode(&uapi.IOMMUIOVARange{Start: x.Start, Last: x.End}))
	}
	return 0, nil
}

func (k *kernel) iommufdIoctl(x *ictx, req uint, arg []byte) (int, error) {
	switch req {
	case uapi.IoctlIOASAlloc:
		var a uapi.IOASAlloc
		if err := uapi.Decode(arg, &a); err != nil || a.Size < 12 || a.Flags != 0 {
			return -1, unix.EINVAL
		}
		k.nextID++
		x.ioass[k.nextID] = &ioas{id: k.nextID, maps: map[uint64]uapi.IOASMap{}}
		putU32(arg, 8, k.nextID)
		return 0, nil
	case uapi.IoctlIOMMUDestroy:
		var d uapi.IOMMUDestroy
		if err := uapi.Decode(arg, &d); err != nil || d.Size < 8 {
			return -1, unix.EINVAL
		}
		a, ok := x.ioass[d.ID]
		if !ok {
			return -1, unix.ENOENT
		}
		if a.attached > 0 {
			return -1, unix.EBUSY
		}
		delete(x.ioass, d.ID)
		k.logf("destroy IOAS %d", d.ID)
		return 0, nil
	case uapi.IoctlIOASMap:
		var m uapi.IOASMap
		if err := uapi.Decode(arg, &m); err != nil || m.Size < 40 || m.Reserved != 0 {
			return -1, unix.EINVAL
		}
		all := uint32(uapi.IOASMapFixedIOVA | uapi.IOASMapReadable | uapi.IOASMapWriteable)
		if m.Flags&^all != 0 || m.Flags&uapi.IOASMapFixedIOVA == 0 {
			return -1, unix.EOPNOTSUPP // a map without a fixed IOVA is not modelled
		}
		a, ok := x.ioass[m.IOASID]
		if !ok {
			return -1, unix.ENOENT
		}
		if m.Length == 0 || m.Length%ioasAlignment != 0 || m.IOVA%ioasAlignment != 0 || m.UserVA%4096 != 0 || m.IOVA+m.Length < m.IOVA {
			return -1, unix.EINVAL
		}
		inside := false
		for _, r := range k.ranges(a) {
			if m.IOVA >= r.Start && m.IOVA+m.Length-1 <= r.End {
				inside = true
			}
		}
		if !inside {
			return -1, unix.EINVAL
		}
		for _, o := range a.maps {
			if m.IOVA < o.IOVA+o.Length && o.IOVA < m.IOVA+m.Length {
				return -1, unix.EEXIST
			}
		}
		if err := k.failure(IoctlMapDMA); err != nil {
			return -1, err
		}
		a.maps[m.IOVA] = m
		return 0, nil
	case uapi.IoctlIOASUnmap:
		var u uapi.IOASUnmap
		if err := uapi.Decode(arg, &u); err != nil || u.Size < 24 {
			return -1, unix.EINVAL
		}
		a, ok := x.ioass[u.IOASID]
		if !ok {
			return -1, unix.ENOENT
		}
		if err := k.failure(IoctlUnmapDMA); err != nil {
			return -1, err
		}
		m, ok := a.maps[u.IOVA]
		if !ok || m.Length != u.Length {
			return -1, unix.ENOENT // iommufd unmaps whole mappings only
		}
		delete(a.maps, u.IOVA)
		k.logf("unmap %#x", u.IOVA)
		binary.NativeEndian.PutUint64(arg[16:], m.Length)
		return 0, nil
	}
	return -1, unix.ENOTTY
}

// cdevIoctl answers a device cdev's fd: the bind, then the attach and
// detach and every request of a group-path device fd.
func (k *kernel) cdevIoctl(fd int, f *fakeFD, req uint, arg []byte) (int, error) {
	d := f.d
	if req == uapi.IoctlDeviceBindIOMMUFD {
		var b uapi.DeviceBindIOMMUFD
		if err := uapi.Decode(arg, &b); err != nil || b.Argsz < 16 || b.Flags != 0 || b.IOMMUFD < 0 {
			return -1, unix.EINVAL
		}
		if f.bound != nil {
			return -1, unix.EINVAL // this fd is bound already
		}
		xf, ok := k.fds[int(b.IOMMUFD)]
		if !ok || xf.x == nil {
			return -1, unix.EBADF
		}
		g := d.g
		switch {
		case g.busy:
			return -1, unix.EBUSY // the group is held through its node
		case d.fd >= 0:
			return -1, unix.EINVAL // the device is open (bound) elsewhere
		case g.owner != nil && g.owner != xf.x:
			return -1, unix.EPERM // another iommufd owns the group's DMA
		case !g.viable:
			return -1, unix.EPERM // a member is driven by a kernel driver
		}
		if err := k.failure(IoctlBindIOMMUFD); err != nil {
			return -1, err
		}
		f.bound = xf.x
		d.fd = fd
		g.owner = xf.x
		g.owned++
		k.nextID++
		putU32(arg, 12, k.nextID)
		k.logf("bind %s", d.Name)
		return 0, nil
	}
	if f.bound == nil {
		return -1, unix.EINVAL // blocked until bound
	}
	switch req {
	case uapi.IoctlDeviceAttachIOMMUFD:
		var a uapi.DeviceAttachIOMMUFDPT
		if err := uapi.Decode(arg, &a); err != nil || a.Argsz < 12 || a.Flags != 0 {
			return -1, unix.EINVAL
		}
		to, ok := f.bound.ioass[a.PTID]
		if !ok {
			return -1, unix.ENOENT
		}
		if err := k.failure(IoctlAttachIOMMUFDPT); err != nil {
			return -1, err
		}
		if f.ioas != nil {
			f.ioas.attached--
		}
		f.ioas = to
		to.attached++
		k.logf("attach %s to IOAS %d", d.Name, to.id)
		return 0, nil
	case uapi.IoctlDeviceDetachIOMMUFD:
		if len(arg) < 8 || u32(arg, 4) != 0 {
			return -1, unix.EINVAL
		}
		if f.ioas != nil {
			f.ioas.attached--
			f.ioas = nil
		}
		return 0, nil
	}
	return k.deviceIoctl(d, req, arg)
}
