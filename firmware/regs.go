package firmware

// Regs is 32-bit register access to a device region: the BAR1 registers for
// a Channel, a ring-state page for a device ring. *mmio.Region satisfies it.
// Offsets are bytes from the start of the region.
type Regs interface {
	Load32(off int) (uint32, error)
	Store32(off int, v uint32) error
}

// BAR1 register offsets.
const (
	RegVersion = 0x00 // R: device interface version
	RegDSRLow  = 0x04 // W: DSR DMA address, low half (write first)
	RegDSRHigh = 0x08 // W: DSR DMA address, high half (write last; loads the DSR)
	RegCtl     = 0x0c // W: device control (Ctl*)
	RegRequest = 0x10 // W: write 0 to execute the command slot
	RegErr     = 0x14 // R: status of the last command or control
	RegICR     = 0x18 // R: interrupt cause (INTx only; QEMU never sets it)
	RegIMR     = 0x1c // R/W: interrupt mask; QEMU: any non-zero value masks all
	RegMACL    = 0x20 // R/W: MAC address, low part
	RegMACH    = 0x24 // R/W: MAC address, high part
)

// CTL register values.
const (
	CtlActivate  = 0
	CtlUnquiesce = 1
	CtlReset     = 2
)

// IMR values.
const (
	IMRUnmaskAll uint32 = 0
	IMRMaskAll   uint32 = 0xFFFFFFFF
)

// MSI-X vectors of the device.
const (
	VectorResponse = 0 // command response
	VectorAsync    = 1 // async events (never raised by QEMU 7.2)
	VectorCQ       = 2 // CQ notification
)
