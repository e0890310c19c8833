package srq_test

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/wq"
)

// Several goroutines, one per connection of a service, refill one shared
// receive queue: Post is safe for concurrent use, and a full queue is an
// inline ErrQueueFull that loses nothing. The low watermark tells them
// when to refill.
func Example_concurrentRefill() {
	const conns, depth = 4, 64
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 7, Addr: 0x10000, Len: 1 << 20, Access: wq.AccessLocalWrite})
	uar, _ := mmio.New(make([]byte, doorbell.PageSize)) // the device's doorbell page, here plain memory
	stride := rings.RecvStride(1)
	state := make([]byte, 8) // the ring's producer and consumer indices
	data := make([]byte, depth*stride)
	q, err := srq.New(srq.Config{
		Name: "SRQ 0", State: state, Data: data, Stride: stride, Slots: depth,
		Register: uar, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv,
		Depth: depth, MaxSGE: 1, PD: 7, Keys: keys,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	qp, _ := q.Attach(0x42) // the QP that takes the receives
	st, _ := rings.NewState(state)
	device, _ := rings.NewConsumer(st, depth) // the NIC's side of the ring

	// refill has each connection's goroutine post n receives, one at a
	// time, and counts those refused because the SRQ was full.
	next := make([]int, conns) // each connection's next wr_id
	refill := func(n int) (refused int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for c := 0; c < conns; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < n; i++ {
					id := uint64(c<<16 | next[c])
					sge := wq.SGE{Addr: 0x10000 + uint64(c)*0x10000 + uint64(next[c]%64)*1024, Length: 1024, LKey: 1}
					_, err := q.Post([]wq.RecvWR{{WRID: id, SGEs: []wq.SGE{sge}}}, false)
					switch {
					case errors.Is(err, wq.ErrQueueFull):
						mu.Lock()
						refused++
						mu.Unlock()
					case err != nil:
						fmt.Println(err)
					default:
						next[c]++
					}
				}
			}()
		}
		wg.Wait()
		return refused
	}

	refill(16)
	fmt.Printf("%d goroutines posted %d receives\n", conns, q.Available())

	// The QP consumes 40 receives: the NIC takes them from the ring, and
	// the CQ poller reports their completions. The watermark, armed at 32,
	// fires once on the way down.
	if err := q.SetLowWatermark(32); err != nil {
		fmt.Println(err)
		return
	}
	sges := make([]rings.SGE, 1)
	if ready, _ := device.Ready(); ready >= 40 {
		for i := 0; i < 40; i++ {
			id, _, _ := rings.DecodeRecvWQE(data[device.Slot(i)*stride:], sges)
			q.Complete(qp, id)
		}
		device.Consume(40)
	}
	select {
	case ev := <-q.LowWatermarkEvents():
		fmt.Printf("low watermark %d: %d available\n", ev.Watermark, ev.Available)
	default:
		fmt.Println("no low-watermark event")
	}

	refused := refill(12) // 48 wanted, 40 fit
	s := q.Query()
	fmt.Printf("refilled to %d (%d refused as full); consumed %d; %d event\n", s.Available, refused, s.Consumed, s.Events)
	// Output:
	// 4 goroutines posted 64 receives
	// low watermark 32: 31 available
	// refilled to 64 (8 refused as full); consumed 40; 1 event
}
