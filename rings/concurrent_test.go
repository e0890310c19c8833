package rings_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/vfrdma/vfrdma/rings"
)

// TestConcurrentDevice runs the driver and a goroutine playing the device
// over shared memory, under -race: the driver posts send WQEs through a
// Producer and polls CQEs through a Consumer; the device drains the send
// queue with a Consumer over the same SQ state (re-reading prod_tail as QEMU
// does), checks every WQE, and answers each with a CQE through a Producer over
// the CQ state. The race detector checks that the counter protocol orders
// every body access: bodies are plain memory, only the counters are atomic.
func TestConcurrentDevice(t *testing.T) {
	const (
		sqN    = 64
		cqN    = 32
		maxSGE = 2
	)
	total := 20000
	if testing.Short() {
		total = 2000
	}
	stride := rings.SendStride(maxSGE)
	sqPage := make([]byte, 4096)
	cqPage := make([]byte, 4096)
	sqData := make([]byte, sqN*stride)
	cqData := make([]byte, cqN*rings.CQESize)

	state := func(page []byte, off int) *rings.State {
		s, err := rings.NewState(page[off:])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Each side builds its own view of the two rings.
	drvSQ, err := rings.NewProducer(state(sqPage, rings.StateOffsetSQ), sqN)
	if err != nil {
		t.Fatal(err)
	}
	drvCQ, err := rings.NewConsumer(state(cqPage, rings.StateOffsetRQ), cqN)
	if err != nil {
		t.Fatal(err)
	}
	devSQ, err := rings.NewConsumer(state(sqPage, rings.StateOffsetSQ), sqN)
	if err != nil {
		t.Fatal(err)
	}
	devCQ, err := rings.NewProducer(state(cqPage, rings.StateOffsetRQ), cqN)
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	devErr := make(chan string, 1)
	fail := func(msg string) {
		select {
		case devErr <- msg:
		default:
		}
	}
	wg.Add(1)
	go func() { // the device
		defer wg.Done()
		w := rings.SendWQE{SGEs: make([]rings.SGE, 0, maxSGE)}
		for seq := 0; seq < total; {
			ready, err := devSQ.Ready()
			if err != nil {
				fail(err.Error())
				return
			}
			if ready == 0 {
				runtime.Gosched()
				continue
			}
			// Drain one WQE at a time, as QEMU does, each needing CQ room.
			free, err := devCQ.Free()
			if err != nil {
				fail(err.Error())
				return
			}
			if free == 0 {
				runtime.Gosched()
				continue
			}
			slot := sqData[devSQ.Slot(0)*stride:]
			if err := rings.DecodeSendWQE(slot, &w); err != nil {
				fail(err.Error())
				return
			}
			if w.WRID != uint64(seq) || len(w.SGEs) != 1+seq%maxSGE || w.SGEs[0].Addr != uint64(seq)<<12 || w.GIDIndex != 1 {
				fail("bad WQE")
				return
			}
			cqe := rings.CQE{WRID: w.WRID, QP: 7, Opcode: rings.WCSend, ByteLen: w.SGEs[0].Length}
			rings.PutCQE(cqData[devCQ.Next(0)*rings.CQESize:], &cqe)
			devCQ.Advance(1)
			devCQ.Publish()
			devSQ.Consume(1)
			seq++
		}
	}()

	sges := make([]rings.SGE, maxSGE)
	var posted, polled int
	var c rings.CQE
	for polled < total {
		select {
		case msg := <-devErr:
			t.Fatal("device:", msg)
		default:
		}
		free, err := drvSQ.Free()
		if err != nil {
			t.Fatal(err)
		}
		batch := min(free, total-posted, 1+posted%5)
		for i := range batch {
			seq := posted + i
			for j := range sges {
				sges[j] = rings.SGE{Addr: uint64(seq) << 12, Length: uint32(seq), LKey: 1}
			}
			w := rings.SendWQE{WRID: uint64(seq), Opcode: rings.WRSend, SGEs: sges[:1+seq%maxSGE], GIDIndex: 1}
			rings.PutSendWQE(sqData[drvSQ.Next(i)*stride:], &w)
		}
		drvSQ.Advance(batch)
		drvSQ.Publish()
		posted += batch

		ready, err := drvCQ.Ready()
		if err != nil {
			t.Fatal(err)
		}
		for i := range ready {
			rings.DecodeCQE(cqData[drvCQ.Slot(i)*rings.CQESize:], &c)
			if c.WRID != uint64(polled+i) || c.ByteLen != uint32(polled+i) || c.QP != 7 {
				t.Fatalf("CQE %d: %+v", polled+i, c)
			}
		}
		drvCQ.Consume(ready)
		polled += ready
		if batch == 0 && ready == 0 {
			runtime.Gosched()
		}
	}
	wg.Wait()
	select {
	case msg := <-devErr:
		t.Fatal("device:", msg)
	default:
	}
}
