package firmware_test

import (
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
)

// A request is encoded into the command slot; the channel stamps a cookie
// the device copies into the response.
func ExampleEncodeRequest() {
	slot := make([]byte, firmware.CmdSlotSize)
	req := firmware.CreateCQRequest{PDirDMA: 0x12345000, CQE: 256, NChunks: 5}
	if err := req.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	if err := firmware.EncodeRequest(slot, 7, req); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("% x\n", slot[:36])
	// Output:
	// 07 00 00 00 00 00 00 00 06 00 00 00 00 00 00 00 00 50 34 12 00 00 00 00 00 00 00 00 00 01 00 00 05 00 00 00
}

// Limits that would make QEMU overrun memory are refused before anything
// reaches the device.
func ExampleCreateCQRequest_Validate() {
	req := firmware.CreateCQRequest{PDirDMA: 0x12345000, CQE: 128, NChunks: 2}
	fmt.Println(req.Validate())
	// Output:
	// CREATE_CQ request.cqe = 0x80, want <= 64 (fits nchunks-1 pages): firmware: invalid argument
}

// The CQ arm doorbell differs on QEMU 7.2, which disarms on ARM alone.
func ExampleQuirks_CQArm() {
	qemu := firmware.Quirks{Version: 17, Emulated: true, CQArmBoth: true}
	var hw firmware.Quirks
	const cq = 3
	fmt.Printf("%#x %#x\n", qemu.CQArm(false)|cq, hw.CQArm(false)|cq)
	// Output:
	// 0x60000003 0x40000003
}
