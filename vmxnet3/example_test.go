package vmxnet3_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/vfrdma/vfrdma"
)

// Frames out and in on the slot's Ethernet function: an ARP request for
// QEMU's user-network gateway (10.0.2.2) and its answer. It needs the
// pvrdma slot itself, its IOMMU group bound to vfio-pci (pvctl bind), in a
// VM of the bench (go run ./cmd/pvvm) or on VMware's hypervisor: the
// device model has no vmxnet3 function. So go test compiles this example
// but does not run it (it has no Output comment).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := vfrdma.Open("0000:00:10.1", nil) // the RDMA function; function 0 comes up beside it
	if err != nil {
		log.Fatal(err)
	}
	eth := d.Ethernet() // nil with vfrdma.Options{Ethernet: vfrdma.EthernetOptions{Off: true}}
	link, err := eth.Link()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(eth.MAC(), link) // up 1000 Mbit/s

	// Who has 10.0.2.2? Tell 10.0.2.15. The Ethernet header, then ARP.
	frame := make([]byte, 14+28)
	copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:12], eth.MAC())
	binary.BigEndian.PutUint16(frame[12:], 0x0806)
	arp := frame[14:]
	binary.BigEndian.PutUint16(arp[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(arp[2:], 0x0800) // IPv4
	arp[4], arp[5] = 6, 4
	binary.BigEndian.PutUint16(arp[6:], 1) // a request
	copy(arp[8:14], eth.MAC())
	copy(arp[14:18], net.IPv4(10, 0, 2, 15).To4())
	copy(arp[24:28], net.IPv4(10, 0, 2, 2).To4())
	// A batch of frames, one doorbell; frames under 60 bytes are padded.
	if _, err := eth.Send([][]byte{frame}); err != nil {
		log.Fatal(err)
	}

	// Caller-owned buffers of MaxFrame bytes. RecvWait sleeps on the
	// receive interrupt until at least one frame is in (Recv does not wait).
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, eth.MaxFrame())
	}
	sizes := make([]int, len(bufs))
	for answered := false; !answered; {
		n, err := eth.RecvWait(ctx, bufs, sizes)
		if err != nil {
			log.Fatal(err)
		}
		for i, f := range bufs[:n] {
			f = f[:sizes[i]]
			if len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2 {
				fmt.Printf("%v is at %v\n", net.IP(f[28:32]), net.HardwareAddr(f[22:28]))
				answered = true
			}
		}
	}
	// Link changes are events: WaitLinkChange(ctx, seen) sleeps until the
	// count of changes passes seen, and returns the link and the new count.
	fmt.Println(eth.LinkChanges(), "link changes")
	st, err := eth.Stats()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.TxFrames, "frames sent,", st.RxFrames, "received")
	if err := d.Close(); err != nil { // closes the Ethernet function too
		log.Fatal(err)
	}
}
