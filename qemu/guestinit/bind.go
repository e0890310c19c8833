package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vfrdma/vfrdma/pci"
)

// bindWait bounds the wait for /dev/vfio/<group> after binding.
const bindWait = 5 * time.Second

// findPVRDMA returns the address of the first pvrdma function, or "".
func findPVRDMA() string {
	fs, err := pci.NewBus("").Find(pci.VendorVMware, pci.DevicePVRDMA)
	if err != nil || len(fs) == 0 {
		return ""
	}
	return fs[0].Addr.String()
}

// bindPVRDMA binds the IOMMU group of the first pvrdma function to vfio-pci
// and waits, at most wait, for its /dev/vfio node. It returns the
// function's address and its group.
func bindPVRDMA(wait time.Duration) (bdf, group string, err error) {
	bus := pci.NewBus("")
	fs, err := bus.Find(pci.VendorVMware, pci.DevicePVRDMA)
	if err != nil {
		return "", "", fmt.Errorf("bind: find 15ad:0820: %w", err)
	}
	if len(fs) == 0 {
		return "", "", errors.New("bind: no 15ad:0820 function (is -device pvrdma on the QEMU command line?)")
	}
	f := fs[0]
	bdf = f.Addr.String()
	group = fmt.Sprint(f.IOMMUGroup)
	if group == "" || group == "-1" {
		return bdf, "", fmt.Errorf("bind: %s has no IOMMU group (QEMU needs -device intel-iommu,intremap=on and the kernel intel_iommu=on)", bdf)
	}
	if _, err := bus.BindGroup(f.Addr, "vfio-pci"); err != nil {
		return bdf, group, fmt.Errorf("bind: IOMMU group %s of %s to vfio-pci: %w", group, bdf, err)
	}
	node := filepath.Join("/dev/vfio", group)
	deadline := time.Now().Add(wait)
	for {
		_, err := os.Stat(node)
		if err == nil {
			return bdf, group, nil
		}
		if time.Now().After(deadline) {
			return bdf, group, fmt.Errorf("bind: %s did not appear within %v after binding %s: %w", node, wait, bdf, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
