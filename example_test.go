package vfrdma_test

import (
	"context"
	"fmt"
	"log"

	"github.com/vfrdma/vfrdma"
)

// Two QPs of one device exchange a message. (It needs a pvrdma NIC whose
// IOMMU group is bound to vfio-pci, so it is compiled, not run, by go test;
// the in-guest tests run the same steps on the bench.)
func Example() {
	ctx := context.Background()
	d, err := vfrdma.Open("0000:00:10.1", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	pd, _ := d.AllocPD(ctx)
	cq, _ := d.CreateCQ(ctx, 64)
	a, _ := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true})
	b, _ := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true})
	mr, _ := pd.AllocMR(ctx, 8192, vfrdma.AccessLocalWrite)
	a.Connect(ctx, vfrdma.Remote{QPN: b.QPN(), GID: d.GID()}, 0)
	b.Connect(ctx, vfrdma.Remote{QPN: a.QPN(), GID: d.GID()}, 0)

	copy(mr.Bytes(), "hello")
	b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(4096, 4096)}}}, 0)
	// Deferred: no doorbell yet. The second post rings once for both.
	a.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{mr.SGE(0, 5)}}}, vfrdma.FlagDefer)
	a.PostSend([]vfrdma.SendWR{{WRID: 3}}, 0)
	b.PostRecv([]vfrdma.RecvWR{{WRID: 4, SGEs: []vfrdma.SGE{mr.SGE(4096+16, 16)}}}, 0)

	wcs := make([]vfrdma.WC, 8)
	for got := 0; got < 4; {
		if err := cq.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		n, err := cq.Poll(wcs)
		if err != nil {
			log.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			fmt.Println(wc.WRID, wc.Status, wc.Opcode)
		}
		got += n
	}
	fmt.Printf("%s\n", mr.Bytes()[4096:4101])
}
