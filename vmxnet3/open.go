package vmxnet3

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio"
)

// VFIO region indexes of the function's BARs.
const (
	regionPT = 0 // BAR0
	regionVD = 1 // BAR1
)

// Open brings up the vmxnet3 function dev, opened through VFIO (the
// pvrdma driver opens it from the slot's group: the two functions share
// it): bus mastering, the registers, its DMA memory at IOVAs of dev's
// container, MSI-X vectors for receive and link events, reset, versions,
// activation. Close undoes it all (the device first). While the NIC is
// open, the paired RDMA port reports the backend's port state (ACTIVE on
// the bench); closed, it reads DOWN.
func Open(dev *vfio.Device, opts *Options) (_ *NIC, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, &OpError{Op: "open", Dev: dev.Name(), Err: err}
	}
	fail := func(op string, e error) (*NIC, error) { return nil, &OpError{Op: op, Dev: dev.Name(), Err: e} }
	id, err := dev.ReadConfig32(0) // vendor, then device
	if err != nil {
		return fail("open", err)
	}
	if vendor, device := uint16(id), uint16(id>>16); vendor != pci.VendorVMware || device != pci.DeviceVMXNET3 {
		return fail("open", invalidf("%04x:%04x is not a vmxnet3 function (%04x:%04x)", vendor, device, pci.VendorVMware, pci.DeviceVMXNET3))
	}
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				_ = undo[i]()
			}
		}
	}()
	if _, err := dev.EnableBusMaster(); err != nil {
		return fail("open", err)
	}
	var regs [2]*mmio.Region
	for i, idx := range []int{regionPT, regionVD} {
		b, err := dev.Map(idx, 0, 0)
		if err != nil {
			return fail("map BAR"+fmt.Sprint(idx), err)
		}
		undo = append(undo, func() error { return dev.Unmap(b) })
		if regs[i], err = mmio.New(b); err != nil {
			return fail("map BAR"+fmt.Sprint(idx), err)
		}
	}
	vecs, err := dev.EnableMSIX(numVecs)
	if err != nil {
		return fail("enable MSI-X", err)
	}
	undo = append(undo, func() error { return dev.DisableIRQs(vfio.IRQMSIX) })
	l := computeLayout(&o)
	buf, err := dev.Container().AllocDMA(l.size, &vfio.MemOptions{HugePages: vfio.HugeNever})
	if err != nil {
		return fail("allocate DMA memory", err)
	}
	undo = append(undo, buf.Close)
	n, err := start(dev.Name(), regs[0], regs[1], buf.Mem, buf.IOVA, vecs[vecRx], vecs[vecEvent], &o)
	if err != nil {
		// Leave the function reset: nothing of ours stays in its hands.
		_ = regs[1].Store32(regCMD, cmdReset)
		return nil, err
	}
	n.release = func() error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = append(errs, undo[i]())
		}
		return errors.Join(errs...)
	}
	return n, nil
}
