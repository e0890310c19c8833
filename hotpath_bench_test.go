package vfrdma

import (
	"encoding/binary"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// The machine's floor for the hot paths, measured in the same run as the
// API benchmarks so that their ratios mean something: what posting a WQE
// and polling a CQE cost at the least, with no checks and no bookkeeping.
//
//   - post: copy a 128-byte WQE into a ring slot and publish the producer
//     index with an atomic store;
//   - poll: load the device's index atomically and copy a 64-byte CQE out
//     of its slot.
func BenchmarkFloor(b *testing.B) {
	const slots = 4096
	b.Run("post", func(b *testing.B) {
		ring := make([]byte, slots*128)
		var wqe [128]byte
		binary.LittleEndian.PutUint64(wqe[:], 42)
		var tail atomic.Uint32
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			t := tail.Load()
			copy(ring[(t&(slots-1))*128:][:128], wqe[:])
			tail.Store(t + 1)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/WQE")
	})
	b.Run("poll", func(b *testing.B) {
		ring := make([]byte, slots*64)
		var cqe [64]byte
		var tail atomic.Uint32
		tail.Store(slots)
		head := uint32(0)
		sum := 0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if tail.Load() != head {
				copy(cqe[:], ring[(head&(slots-1))*64:][:64])
				head++
				sum += int(cqe[0])
			}
			if head == tail.Load() {
				tail.Add(slots)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/CQE")
		_ = sum
	})
}

// BenchmarkPostSend times PostSend alone: a validated chain of batch sends
// (one SGE each) and its doorbell. A fake device drains the ring and the
// completions are polled outside the timer whenever the queue is full.
func BenchmarkPostSend(b *testing.B) {
	for _, typ := range []QPType{RC, UD} {
		for _, batch := range []int{1, 32} {
			b.Run(typ.String()+"/batch"+strconv.Itoa(batch), func(b *testing.B) {
				const depth = 1024
				f := newFixture(b, typ, depth)
				ah := &AH{pd: f.pd, dgid: GID{0xfe, 0x80}}
				wrs := make([]SendWR, batch)
				sges := make([]SGE, batch)
				for i := range wrs {
					sges[i] = f.sge(i*64, 64)
					wrs[i] = SendWR{WRID: uint64(i), SGEs: sges[i : i+1]}
					if typ == UD {
						wrs[i].AH, wrs[i].RemoteQPN, wrs[i].RemoteQKey = ah, 0x99, 9
					}
				}
				wcs := make([]WC, 256)
				drain := func() {
					f.device(b, 0)
					for {
						n, err := f.cq.Poll(wcs)
						if err != nil {
							b.Fatal(err)
						}
						if n == 0 {
							return
						}
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if f.qp.sq.Outstanding()+batch > depth {
						b.StopTimer()
						drain()
						b.StartTimer()
					}
					if _, err := f.qp.PostSend(wrs, 0); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
			})
		}
	}
}

// BenchmarkPoll times Poll alone: batch completions per call, from CQEs a
// fake device wrote outside the timer.
func BenchmarkPoll(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run("batch"+strconv.Itoa(batch), func(b *testing.B) {
			const depth = 1024 // the fixture's CQ holds 4×
			f := newFixture(b, RC, depth)
			wrs := make([]SendWR, 32)
			for i := range wrs {
				wrs[i] = SendWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*64, 64)}}
			}
			ready := 0
			refill := func() {
				for f.qp.sq.Outstanding() < depth { // untimed: require's cost does not count
					_, err := f.qp.PostSend(wrs, 0)
					require.NoError(b, err)
				}
				ready = f.device(b, 0)
			}
			wcs := make([]WC, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if ready < batch {
					b.StopTimer()
					for ready > 0 { // what is left, untimed
						n, _ := f.cq.Poll(wcs[:ready])
						ready -= n
					}
					refill()
					b.StartTimer()
				}
				n, err := f.cq.Poll(wcs)
				if err != nil || n != batch {
					b.Fatalf("poll: %d, %v", n, err)
				}
				ready -= n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/CQE")
		})
	}
}

// BenchmarkHotPathParts splits PostSend and Poll at batch 32 into their
// parts, in the same run as the whole calls and the floor, so that the
// note on what keeps them above the floor names each part and its cost:
//
//   - post/checks: the per-request checks alone (opcode, SGE count, and
//     per SGE: the lkey lookup, PD, access and bounds);
//   - post/write: the WQE encoded into the ring and its wr_id recorded,
//     then the call closed (index published, doorbell), no checks;
//   - post/encode: the WQEs encoded into successive slots alone: write
//     less this is the wr_id record and closing the call;
//   - poll/decode: the CQEs decoded, no accounting: Poll less this is the
//     accounting (QPN lookup, the wr_id record, the queue's completion
//     count) and filling the WCs.
func BenchmarkHotPathParts(b *testing.B) {
	const depth, batch = 1024, 32
	f := newFixture(b, RC, depth)
	wrs := make([]SendWR, batch)
	for i := range wrs {
		wrs[i] = SendWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*64, 64)}}
	}
	wcs := make([]WC, 256)
	drain := func() {
		f.device(b, 0)
		for {
			n, err := f.cq.Poll(wcs)
			require.NoError(b, err)
			if n == 0 {
				return
			}
		}
	}
	perWQE := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
	}
	b.Run("post/checks", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			sges := wq.NewSGEChecker(&f.d.lkeys, f.pd.handle, f.qp.sq.MaxSGE(), false)
			for j := range wrs {
				if err := f.qp.checkSend(&wrs[j], &sges, true); err != nil {
					b.Fatal(err)
				}
			}
		}
		perWQE(b)
	})
	b.Run("post/write", func(b *testing.B) {
		wqe := rings.SendWQE{}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if f.qp.sq.Outstanding()+batch > depth {
				b.StopTimer()
				drain()
				b.StartTimer()
			}
			for j := range wrs {
				wr := &wrs[j]
				wqe.WRID, wqe.Opcode, wqe.Flags, wqe.Imm, wqe.SGEs = wr.WRID, opcodes[wr.Opcode].wire, uint32(wr.Flags), wr.Imm, wr.SGEs
				rings.PutSendWQE(f.qp.sq.Claim(wr.WRID), &wqe)
			}
			if err := f.qp.sq.End(false); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		perWQE(b)
	})
	b.Run("post/encode", func(b *testing.B) {
		wqe := rings.SendWQE{}
		slots := f.qp.sq.Slots()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			for j := range wrs {
				wr := &wrs[j]
				wqe.WRID, wqe.Opcode, wqe.Flags, wqe.Imm, wqe.SGEs = wr.WRID, opcodes[wr.Opcode].wire, uint32(wr.Flags), wr.Imm, wr.SGEs
				rings.PutSendWQE(f.qp.sq.Slot((i*batch+j)&(slots-1)), &wqe)
			}
		}
		perWQE(b)
	})
	var e rings.CQE
	prepare := func() int {
		drain()
		for f.qp.sq.Outstanding() < depth {
			_, err := f.qp.PostSend(wrs, 0)
			require.NoError(b, err)
		}
		return f.device(b, 0)
	}
	b.Run("poll/decode", func(b *testing.B) {
		ready := prepare()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for j := range batch {
				rings.DecodeCQEWork(f.cq.data[f.cq.cons.Slot(j%ready)*CQESize:], &e)
			}
		}
		perWQE(b)
	})
}

// BenchmarkLifecycleGate prices the lifecycle gate (doc.go) in one run:
// PostSend and Poll as the API runs them (inside their object's gate)
// beside the same calls without it (postSend, poll: what the calls were
// before the gate), alternately, batch 1 and 32. The difference is the
// gate's two atomic adds per call.
func BenchmarkLifecycleGate(b *testing.B) {
	const depth = 1024
	for _, batch := range []int{1, 32} {
		for _, gated := range []bool{true, false} {
			name := "post/batch" + strconv.Itoa(batch) + map[bool]string{true: "/gated", false: "/ungated"}[gated]
			b.Run(name, func(b *testing.B) {
				f := newFixture(b, RC, depth)
				wrs := make([]SendWR, batch)
				for i := range wrs {
					wrs[i] = SendWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*64, 64)}}
				}
				wcs := make([]WC, 256)
				drain := func() {
					f.device(b, 0)
					for {
						n, err := f.cq.Poll(wcs)
						require.NoError(b, err)
						if n == 0 {
							return
						}
					}
				}
				post := f.qp.PostSend
				if !gated {
					post = f.qp.postSend
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if f.qp.sq.Outstanding()+batch > depth {
						b.StopTimer()
						drain()
						b.StartTimer()
					}
					if _, err := post(wrs, 0); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
			})
		}
		for _, gated := range []bool{true, false} {
			name := "poll/batch" + strconv.Itoa(batch) + map[bool]string{true: "/gated", false: "/ungated"}[gated]
			b.Run(name, func(b *testing.B) {
				f := newFixture(b, RC, depth)
				wrs := make([]SendWR, 32)
				for i := range wrs {
					wrs[i] = SendWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*64, 64)}}
				}
				poll := f.cq.Poll
				if !gated {
					poll = f.cq.poll
				}
				ready := 0
				wcs := make([]WC, batch)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if ready < batch {
						b.StopTimer()
						for ready > 0 {
							n, _ := f.cq.Poll(wcs[:ready])
							ready -= n
						}
						for f.qp.sq.Outstanding() < depth {
							_, err := f.qp.PostSend(wrs, 0)
							require.NoError(b, err)
						}
						ready = f.device(b, 0)
						b.StartTimer()
					}
					n, err := poll(wcs)
					if err != nil || n != batch {
						b.Fatalf("poll: %d, %v", n, err)
					}
					ready -= n
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/CQE")
			})
		}
	}
}

// BenchmarkPollWithUnsignaledSendsPending prices what Poll pays on a device
// that honours signaling while a QP of its has unsignaled sends the device
// has not consumed: each poll reaps the QP (its consumer index read under
// the reap lock), beside the same empty poll with nothing to reap.
func BenchmarkPollWithUnsignaledSendsPending(b *testing.B) {
	for _, pending := range []bool{false, true} {
		b.Run(map[bool]string{false: "none", true: "pending"}[pending], func(b *testing.B) {
			r := newRDDevice(b, realV20)
			cq := r.cq(b, 256)
			qp := r.rcQP(b, cq, 64, false, qpAnswer{qpn: 0x10, handle: 1})
			if pending {
				_, err := qp.PostSend(sends(8, 0, 0, r.mr.SGE(0, 8)), 0)
				require.NoError(b, err)
				require.True(b, cq.reapPending.Load())
			}
			wcs := make([]WC, 16)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if n, err := cq.Poll(wcs); n != 0 || err != nil {
					b.Fatal(n, err)
				}
			}
			b.StopTimer()
			require.Equal(b, pending, cq.reapPending.Load(), "still pending: the device consumed nothing")
		})
	}
}
