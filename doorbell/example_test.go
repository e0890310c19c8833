package doorbell_test

import (
	"encoding/binary"
	"fmt"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
)

func Example() {
	// In the driver: the UAR page mapped from BAR2, and the send queue's
	// ring producer over DMA memory.
	uar := make([]byte, doorbell.PageSize)
	reg, _ := mmio.New(uar)
	statePage := make([]byte, 4096)
	state, _ := rings.NewState(statePage[rings.StateOffsetSQ:])
	sq, _ := rings.NewProducer(state, 64)
	const qpHandle = 0x11
	q, err := doorbell.NewQueue(reg, doorbell.OffsetQP, doorbell.QPSend|qpHandle, sq)
	if err != nil {
		fmt.Println(err)
		return
	}

	// Three posts flagged Defer, then one without: one doorbell for four WQEs.
	for i := range 4 {
		// ... rings.PutSendWQE(slot of sq.Next(0), &wqe) ...
		sq.Advance(1)
		q.Added(1)
		_ = q.Post(i < 3)
	}
	fmt.Printf("prod_tail %d, doorbell %#x\n", state.ProdTail(), binary.LittleEndian.Uint32(uar[doorbell.OffsetQP:]))

	// A deferred post, then a post that fails validation: the deferred WQE
	// still goes to the device; the failed one was never written.
	sq.Advance(1)
	q.Added(1)
	_ = q.Post(true)
	_ = q.Fail()
	fmt.Printf("prod_tail %d, %+v\n", state.ProdTail(), q.Stats())

	// CQ doorbells are written directly.
	_ = doorbell.Ring(reg, doorbell.OffsetCQ, doorbell.CQPoll|0x3)
	// Output:
	// prod_tail 4, doorbell 0x40000011
	// prod_tail 5, {Posts:5 WQEs:5 Doorbells:2 DeferredPosts:4 FailedPosts:1 Rings:0}
}
