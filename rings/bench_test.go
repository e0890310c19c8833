package rings_test

import (
	"strconv"
	"testing"

	"github.com/vfrdma/vfrdma/rings"
)

// TestNoAllocs asserts that the hot paths allocate nothing.
func TestNoAllocs(t *testing.T) {
	_, sqs := newState(t, rings.StateOffsetSQ)
	p, err := rings.NewProducer(sqs, 64)
	if err != nil {
		t.Fatal(err)
	}
	_, cqs := newState(t, rings.StateOffsetRQ)
	c, err := rings.NewConsumer(cqs, 64)
	if err != nil {
		t.Fatal(err)
	}
	slot := make([]byte, 256)
	sges := []rings.SGE{{1, 2, 3}, {4, 5, 6}}
	ud := &rings.UDAddr{RemoteQPN: 1, DGID: [16]byte{1}}
	rc := &rings.SendWQE{WRID: 1, SGEs: sges, GIDIndex: 1}
	udw := &rings.SendWQE{WRID: 1, SGEs: sges, UD: ud}
	golden, _ := cqeGolden()
	var cqe rings.CQE
	var dec rings.SendWQE
	dec.SGEs = make([]rings.SGE, 0, 4)
	dec.UD = new(rings.UDAddr)
	rsges := make([]rings.SGE, 4)

	for name, f := range map[string]func(){
		"PutSendWQE RC": func() { rings.PutSendWQE(slot, rc) },
		"PutSendWQE UD": func() { rings.PutSendWQE(slot, udw) },
		"PutRecvWQE":    func() { rings.PutRecvWQE(slot, 9, sges) },
		"DecodeCQE":     func() { rings.DecodeCQE(golden, &cqe) },
		"PutCQE":        func() { rings.PutCQE(slot, &cqe) },
		"DecodeSendWQE": func() { rings.PutSendWQE(slot, udw); _ = rings.DecodeSendWQE(slot, &dec) },
		"DecodeRecvWQE": func() { rings.PutRecvWQE(slot, 9, sges); _, _, _ = rings.DecodeRecvWQE(slot, rsges) },
		"produce": func() {
			free, _ := p.Free()
			if free > 0 {
				_ = p.Next(0)
				p.Advance(1)
			}
			p.Publish()
			sqs.SetConsHead(sqs.ProdTail())
		},
		"consume": func() {
			cqs.SetProdTail((cqs.ConsHead() + 3) & 127)
			n, _ := c.Ready()
			_ = c.Slot(n - 1)
			c.Consume(n)
		},
	} {
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s: %v allocations per run", name, n)
		}
	}
}

// BenchmarkProducePublish posts batches of send WQEs (2 SGEs, RC) the way
// PostSend does: Free once, write each body, Advance, Publish once. The
// device side is a store of cons_head after each batch. ns/op is per batch;
// ns/WQE is reported too.
func BenchmarkProducePublish(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(strconv.Itoa(batch), func(b *testing.B) {
			const n = 256
			stride := rings.SendStride(2)
			_, s := newState(b, rings.StateOffsetSQ)
			p, err := rings.NewProducer(s, n)
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, n*stride)
			w := rings.SendWQE{Opcode: rings.WRSend, Flags: rings.SendSignaled, GIDIndex: 1,
				SGEs: []rings.SGE{{Addr: 0x1000, Length: 64, LKey: 1}, {Addr: 0x2000, Length: 64, LKey: 1}}}
			b.ReportAllocs()
			for b.Loop() {
				free, err := p.Free()
				if err != nil || free < batch {
					b.Fatal(free, err)
				}
				for i := range batch {
					w.WRID++
					rings.PutSendWQE(data[p.Next(i)*stride:], &w)
				}
				p.Advance(batch)
				p.Publish()
				s.SetConsHead(s.ProdTail()) // the device drains it
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
		})
	}
}

// BenchmarkConsumeDecode polls batches of CQEs: Ready once, decode each,
// Consume once. The device side is a store of prod_tail before each poll.
func BenchmarkConsumeDecode(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(strconv.Itoa(batch), func(b *testing.B) {
			const n = 256
			_, s := newState(b, rings.StateOffsetRQ)
			c, err := rings.NewConsumer(s, n)
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, n*rings.CQESize)
			for i := range n {
				rings.PutCQE(data[i*rings.CQESize:], &rings.CQE{WRID: uint64(i), QP: 5, Opcode: rings.WCRecv, ByteLen: 100})
			}
			cqes := make([]rings.CQE, batch)
			var sum uint64
			b.ReportAllocs()
			for b.Loop() {
				s.SetProdTail((s.ConsHead() + uint32(batch)) & (2*n - 1)) // the device wrote a batch
				ready, err := c.Ready()
				if err != nil || ready != batch {
					b.Fatal(ready, err)
				}
				for i := range ready {
					rings.DecodeCQE(data[c.Slot(i)*rings.CQESize:], &cqes[i])
					sum += cqes[i].WRID
				}
				c.Consume(ready)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/CQE")
			_ = sum
		})
	}
}
