package vfio

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// Group is an IOMMU group attached to a Container. It is safe for
// concurrent use; its state is guarded by the container's lock. On the cdev
// path it holds no node: its devices are opened, bound and attached each
// through its own cdev.
type Group struct {
	c    *Container
	n    int
	fd   int    // -1 on the cdev path
	dev  string // "group N", for errors
	cdev bool

	closed  bool
	fdGone  bool
	devices []*Device
}

// Number returns the IOMMU group number.
func (g *Group) Number() int { return g.n }

// Container returns the container the group is attached to.
func (g *Group) Container() *Container { return g.c }

// Status reports the group's VFIO status: viable (every member bound to a
// VFIO driver or none) and attached to a container. On the cdev path,
// where the group has no node, it returns an error wrapping
// ErrNotSupported.
func (g *Group) Status() (viable, containerSet bool, err error) {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	if g.closed {
		return false, false, opErr("status", g.dev, ErrClosed)
	}
	if g.cdev {
		return false, false, opErr("status", g.dev, wrapf(ErrNotSupported, nil, "on the cdev path the group has no node (VFIO_GROUP_GET_STATUS)"))
	}
	st, err := uapi.GroupGetStatus(g.c.k, g.fd)
	if err != nil {
		return false, false, opErr("status", g.dev, fmt.Errorf("VFIO_GROUP_GET_STATUS: %w", err))
	}
	return st.Flags&uapi.GroupFlagsViable != 0, st.Flags&uapi.GroupFlagsContainerSet != 0, nil
}

// OpenDevice opens the device called name in the group (for PCI its address,
// "0000:00:10.1") and reads its region and IRQ information. On the cdev
// path it opens the device's cdev (named in sysfs under vfio-dev/), binds
// it to the container's iommufd (VFIO_DEVICE_BIND_IOMMUFD) and attaches it
// to the IOAS (VFIO_DEVICE_ATTACH_IOMMUFD_PT) first.
func (g *Group) OpenDevice(name string) (*Device, error) {
	c := g.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.closed || c.closed {
		return nil, opErr("open", name, ErrClosed)
	}
	for _, d := range g.devices {
		if d.name == name {
			return nil, opErr("open", name, wrapf(ErrBusy, nil, "%s is already open", name))
		}
	}
	if g.cdev {
		d, err := g.openCDevLocked(name)
		if err != nil {
			return nil, opErr("open", name, err)
		}
		g.devices = append(g.devices, d)
		return d, nil
	}
	fd, err := uapi.GroupGetDeviceFD(c.k, g.fd, name)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENODEV) {
			err = fmt.Errorf("VFIO_GROUP_GET_DEVICE_FD: %w (is %s a member of IOMMU group %d, bound to vfio-pci?)", err, name, g.n)
		} else if errors.Is(err, unix.EBUSY) {
			err = wrapf(ErrBusy, err, "VFIO_GROUP_GET_DEVICE_FD: %s is open elsewhere", name)
		} else {
			err = fmt.Errorf("VFIO_GROUP_GET_DEVICE_FD: %w", err)
		}
		return nil, opErr("open", name, err)
	}
	d := &Device{g: g, name: name, fd: fd, vectors: map[int][]*Vector{}}
	if err := d.readInfo(); err != nil {
		_ = c.k.Close(fd)
		return nil, opErr("open", name, err)
	}
	g.devices = append(g.devices, d)
	return d, nil
}

func (g *Group) openDevices() []*Device {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	return slices.Clone(g.devices)
}

func (g *Group) deviceClosed(d *Device) {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	g.devices = slices.DeleteFunc(g.devices, func(x *Device) bool { return x == d })
}

// Close closes the group's devices, then the group, detaching it from the
// container. Closing the container's last group makes the kernel drop the
// IOMMU and every DMA mapping in it. Close is idempotent.
func (g *Group) Close() error {
	g.c.mu.Lock()
	if g.closed {
		g.c.mu.Unlock()
		return nil
	}
	g.closed = true // no new devices from here on
	g.c.mu.Unlock()
	var errs []error
	for _, d := range g.openDevices() {
		errs = append(errs, d.Close())
	}
	errs = append(errs, g.closeFD())
	return opErr("close", g.dev, errors.Join(errs...))
}

// closeFD closes the group fd once and takes the group out of the
// container.
func (g *Group) closeFD() error {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	g.closed = true
	if g.fdGone {
		return nil
	}
	g.fdGone = true
	g.c.groupClosedLocked(g)
	if g.cdev {
		return nil
	}
	return g.c.k.Close(g.fd)
}
