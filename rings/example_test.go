package rings_test

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/rings"
)

func Example() {
	// In the driver these are DMA pages: a zeroed ring-state page and the
	// element pages of a QP's send queue and of a CQ.
	statePage := make([]byte, 4096)
	cqStatePage := make([]byte, 4096)
	const sqN, cqN, maxSGE = 64, 64, 1
	stride := rings.SendStride(maxSGE)
	sqData := make([]byte, sqN*stride)
	cqData := make([]byte, cqN*rings.CQESize)

	sqState, _ := rings.NewState(statePage[rings.StateOffsetSQ:])
	sq, _ := rings.NewProducer(sqState, sqN)
	sq.SetName("SQ")
	cqState, _ := rings.NewState(cqStatePage[rings.StateOffsetRQ:])
	cq, _ := rings.NewConsumer(cqState, cqN)
	cq.SetName("CQ")

	// Post two sends: bodies first, then one Publish (then the doorbell).
	if free, err := sq.Free(); err != nil || free < 2 {
		fmt.Println("no room:", free, err)
		return
	}
	for i := range 2 {
		w := rings.SendWQE{WRID: uint64(100 + i), Opcode: rings.WRSend, GIDIndex: 1,
			SGEs: []rings.SGE{{Addr: 0x10000, Length: 512, LKey: 7}}}
		rings.PutSendWQE(sqData[sq.Next(i)*stride:], &w)
	}
	sq.Advance(2)
	sq.Publish()
	fmt.Println("published prod_tail:", sqState.ProdTail())

	// The device would now write CQEs and advance the CQ's prod_tail.
	rings.PutCQE(cqData[0:], &rings.CQE{WRID: 100, Opcode: rings.WCSend})
	rings.PutCQE(cqData[64:], &rings.CQE{WRID: 101, Opcode: rings.WCSend, Status: rings.WCWRFlushErr})
	cqState.SetProdTail(2)

	// Poll: read prod_tail once, then the bodies, then hand the slots back.
	n, err := cq.Ready()
	if err != nil {
		fmt.Println(err)
		return
	}
	var c rings.CQE
	for i := range n {
		rings.DecodeCQE(cqData[cq.Slot(i)*rings.CQESize:], &c)
		fmt.Println(c.WRID, rings.WCOpcode(c.Opcode), rings.WCStatus(c.Status))
	}
	cq.Consume(n)

	// A device that writes nonsense is reported, not trusted.
	cqState.SetProdTail(1000)
	_, err = cq.Ready()
	fmt.Println(errors.Is(err, rings.ErrDeviceFault))
	// Output:
	// published prod_tail: 2
	// 100 SEND SUCCESS
	// 101 SEND WR_FLUSH_ERR
	// true
}
