package vfrdma

import (
	"errors"
	"os"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/vfio"
)

// vfioFunction is the pvrdma function through VFIO, what Open runs on.
type vfioFunction struct {
	dev     *vfio.Device
	vectors bool
}

var (
	_ hw.Function   = (*vfioFunction)(nil)
	_ hw.UARLocator = (*vfioFunction)(nil)
)

func (f *vfioFunction) Name() string { return f.dev.Name() }

func (f *vfioFunction) Registers() (hw.Registers, error) {
	b, err := f.dev.Map(regionRegs, 0, 0)
	if err != nil {
		return nil, err
	}
	return mmio.New(b)
}

func (f *vfioFunction) Doorbells() (hw.Doorbells, error) {
	b, err := f.dev.Map(regionUAR, 0, firmware.PageSize)
	if err != nil {
		return nil, err
	}
	return mmio.New(b)
}

func (f *vfioFunction) EnableVectors(n int) ([]hw.Vector, error) {
	vs, err := f.dev.EnableMSIX(n)
	if err != nil {
		return nil, err
	}
	f.vectors = true
	out := make([]hw.Vector, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return out, nil
}

func (f *vfioFunction) AllocDMA(size int, huge bool) (*vfio.DMABuffer, error) {
	var opts *vfio.MemOptions // huge pages where the size allows
	if !huge {
		opts = &vfio.MemOptions{HugePages: vfio.HugeNever}
	}
	return f.dev.Container().AllocDMA(size, opts)
}

func (f *vfioFunction) MapDMA(mem []byte) (uint64, error) {
	c := f.dev.Container()
	size := uint64(len(mem))
	iova, err := c.AllocIOVA(size, uint64(os.Getpagesize()))
	if err != nil {
		return 0, err
	}
	if err := c.MapDMA(mem, iova); err != nil {
		return 0, errors.Join(err, c.FreeIOVA(iova, size))
	}
	return iova, nil
}

func (f *vfioFunction) UnmapDMA(iova uint64, size int) error {
	c := f.dev.Container()
	return errors.Join(c.UnmapDMA(iova, uint64(size)), c.FreeIOVA(iova, uint64(size)))
}

// UARPFN reads BAR2's bus address from the function's config space (a
// 64-bit BAR takes the next register too) and returns its page frame.
func (f *vfioFunction) UARPFN() (uint64, error) {
	const bar2 = 0x18
	lo, err := f.dev.ReadConfig32(bar2)
	if err != nil {
		return 0, err
	}
	addr := uint64(lo &^ 0xF)
	if lo&0x6 == 0x4 { // a 64-bit memory BAR
		hi, err := f.dev.ReadConfig32(bar2 + 4)
		if err != nil {
			return 0, err
		}
		addr |= uint64(hi) << 32
	}
	return addr / firmware.PageSize, nil
}

// Close disables the vectors and closes the device, which unmaps the BARs
// and closes the group and the container.
func (f *vfioFunction) Close() error {
	var err error
	if f.vectors {
		err = f.dev.DisableIRQs(vfio.IRQMSIX)
	}
	return errors.Join(err, f.dev.Close())
}
