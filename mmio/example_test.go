package mmio_test

import (
	"fmt"

	"github.com/vfrdma/vfrdma/mmio"
)

func Example() {
	// In the driver the memory is a BAR mapped by vfio.Device.Map; here it
	// is ordinary memory standing in for a device's registers.
	bar := make([]byte, 256)
	regs, err := mmio.New(bar)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := regs.Store32(0x1c, 0); err != nil { // unmask interrupts
		fmt.Println(err)
		return
	}
	v, err := regs.Load32(0x00)
	fmt.Println(v, err)
	_, err = regs.Load32(0x102)
	fmt.Println(err)
	// Output:
	// 0 <nil>
	// mmio: Load32 at offset 0x102 of a 0x100-byte region: mmio: offset out of range
}
