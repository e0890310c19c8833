package vfio_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio"
)

// Take the pvrdma function, read a register, wait for an interrupt, and
// give the device a DMA buffer.
func Example() {
	addr, _ := pci.ParseAddr("0000:00:10.1")
	bus := pci.NewBus("")
	if _, err := bus.BindGroup(addr, "vfio-pci"); err != nil {
		fmt.Println(err) // e.g. "... run `modprobe vfio-pci`"
		return
	}
	d, err := vfio.Open(addr, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close() // IRQs off, BARs unmapped, DMA unmapped and freed, fds closed

	if _, err := d.EnableBusMaster(); err != nil {
		fmt.Println(err)
		return
	}
	bar1, err := d.Map(vfio.RegionBAR1, 0, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	regs, _ := mmio.New(bar1)
	version, _ := regs.Load32(0)
	fmt.Println("version", version)

	vecs, err := d.EnableMSIX(3)
	if err != nil {
		fmt.Println(err)
		return
	}
	buf, err := d.Container().AllocDMA(4096, nil)
	if err != nil {
		fmt.Println(err) // says how far to raise RLIMIT_MEMLOCK if that is the problem
		return
	}
	defer buf.Close()
	fmt.Printf("DSR at IOVA %#x\n", buf.IOVA) // the device's address for buf.Mem[0]

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := vecs[0].Wait(ctx); err != nil {
		fmt.Println(err) // names the vector and the device
	}
}
