package srq_test

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/wq"
)

// Several goroutines, one per connection of a service, refill one shared
// receive queue: Post is safe for concurrent use, and a full queue is an
// inline ErrQueueFull that loses nothing.
func Example_concurrentRefill() {
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 7, Addr: 0x10000, Len: 1 << 20, Access: wq.AccessLocalWrite})
	uar, _ := mmio.New(make([]byte, doorbell.PageSize)) // the device's doorbell page, here plain memory
	q, err := srq.New(srq.Config{
		Name: "SRQ 0", State: make([]byte, 8), Data: make([]byte, 64*32), Stride: 32, Slots: 64,
		Register: uar, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv,
		Depth: 48, MaxSGE: 1, PD: 7, Keys: keys,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	full := 0
	for conn := 0; conn < 4; conn++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 16; i++ {
				id := uint64(conn<<8 | i)
				sge := wq.SGE{Addr: 0x10000 + id*1024, Length: 1024, LKey: 1}
				if _, err := q.Post([]wq.RecvWR{{WRID: id, SGEs: []wq.SGE{sge}}}, false); errors.Is(err, wq.ErrQueueFull) {
					mu.Lock()
					full++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("posted %d of 64 into a depth of %d; %d refused as full\n", q.Available(), q.Depth(), full)
	// Output: posted 48 of 64 into a depth of 48; 16 refused as full
}
