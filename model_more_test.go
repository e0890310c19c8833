package vfrdma_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/pvsim"
)

// A shared receive queue on the model: two QPs consume one pool, each
// receive once, the per-QP query counts what each took, the low watermark
// fires once when the pool runs low; the SRQ closes after its QPs.
func TestModelSRQSharedByTwoQPs(t *testing.T) {
	for _, cfg := range []pvsim.Config{{QEMU: true}, vmware(20)} {
		name := "v20"
		if cfg.QEMU {
			name = "qemu"
		}
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			d, _ := openModel(t, cfg, nil)
			pd, err := d.AllocPD(ctx)
			require.NoError(t, err)
			cq, err := d.CreateCQ(ctx, 128)
			require.NoError(t, err)
			events := make(chan vfrdma.SRQEvent, 4)
			srq, err := pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: 16, CQ: cq, OnLowWatermark: func(e vfrdma.SRQEvent) { events <- e }})
			require.NoError(t, err)
			mr, err := pd.AllocMR(ctx, 1<<16, vfrdma.AccessLocalWrite)
			require.NoError(t, err)
			var senders, receivers []*vfrdma.QP
			for range 2 {
				s, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true})
				require.NoError(t, err)
				r, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq, SignalAll: true})
				require.NoError(t, err)
				require.NoError(t, s.Connect(ctx, vfrdma.Remote{QPN: r.QPN(), GID: d.GID()}, 0))
				require.NoError(t, r.Connect(ctx, vfrdma.Remote{QPN: s.QPN(), GID: d.GID()}, 0))
				senders, receivers = append(senders, s), append(receivers, r)
			}
			recvs := make([]vfrdma.RecvWR, 8)
			for i := range recvs {
				recvs[i] = vfrdma.RecvWR{WRID: uint64(100 + i), SGEs: []vfrdma.SGE{mr.SGE(4096+i*256, 256)}}
			}
			_, err = srq.PostRecv(recvs, 0)
			require.NoError(t, err)
			require.NoError(t, srq.SetLowWatermark(4))
			for i := range 6 {
				s := senders[i%2]
				_, err := s.PostSend([]vfrdma.SendWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(i*64, 64)}}}, 0)
				require.NoError(t, err)
			}
			byQP := map[uint32]int{}
			for _, wc := range waitWCs(t, ctx, cq, 12) {
				require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
				if wc.Opcode == vfrdma.WCRecv {
					byQP[wc.QPN]++
				}
			}
			assert.Equal(t, map[uint32]int{receivers[0].QPN(): 3, receivers[1].QPN(): 3}, byQP)
			assert.Equal(t, 2, srq.Outstanding(), "8 posted, 6 consumed")
			select {
			case e := <-events:
				assert.Equal(t, 4, e.Watermark)
			default:
				assert.Fail(t, "no low-watermark event")
			}
			assert.Empty(t, events, "one event")
			for _, q := range append(senders, receivers...) {
				require.NoError(t, q.Close())
			}
			require.NoError(t, srq.Close())
		})
	}
}

// The caller's own page-aligned memory registers (the driver maps it for
// the device) and carries a message.
func TestModelRegisterMR(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	mem, err := unix.Mmap(-1, 0, 2*unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	_, err = p.pd.RegisterMR(ctx, mem[1:], vfrdma.AccessLocalWrite)
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "not page-aligned")
	own, err := p.pd.RegisterMR(ctx, mem, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	assert.Equal(t, len(mem), own.Len())
	copy(mem, "from the caller's memory")
	_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{own.SGE(0, 24)}}}, 0)
	require.NoError(t, err)
	for _, wc := range waitWCs(t, ctx, p.cq, 2) {
		require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
	}
	assert.Equal(t, "from the caller's memory", string(p.mr.Bytes()[:24]))
	mrs := len(m.MRs())
	require.NoError(t, own.Close())
	assert.Len(t, m.MRs(), mrs-1, "DESTROY_MR")
}

// GIDs bind and unbind at the indices asked, on the device too.
func TestModelBindAndUnbindGIDs(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	g := d.GID()
	g[15] ^= 0xFF
	require.NoError(t, d.BindGID(ctx, 3, g))
	assert.Equal(t, map[int]vfrdma.GID{0: d.GID(), 3: g}, d.GIDs())
	assert.Len(t, m.GIDs(), 2)
	require.NoError(t, d.UnbindGID(ctx, 3))
	assert.Len(t, d.GIDs(), 1)
	assert.Len(t, m.GIDs(), 1)
	assert.ErrorIs(t, d.UnbindGID(ctx, 3), vfrdma.ErrInvalid, "not bound")
	assert.ErrorIs(t, d.BindGID(ctx, 100000, g), vfrdma.ErrInvalid, "beyond the table")
}

// The device's view of a QP's state follows the driver's transitions.
func TestModelQueryState(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	st, err := p.a.QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.StateRTS, st)
	require.NoError(t, p.a.SetError(ctx))
	st, err = p.a.QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.StateErr, st)
}

// A process that died holding the device left objects on it; the next
// Open finds them in the journal and destroys them.
func TestModelOpenRecoversACrashedHoldersObjects(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	m, err := pvsim.New(vmware(20))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	first, err := vfrdma.OpenFunction(m, &vfrdma.Options{StateDir: dir})
	require.NoError(t, err)
	p := newRCPair(t, ctx, first, true, vfrdma.AccessLocalWrite)
	_ = p
	left := m.Objects()
	require.Equal(t, 2, left.QPs)
	// The first holder "dies": it never closes (its goroutines stay, as
	// a dead process's would not, but it touches the device no more).
	second, err := vfrdma.OpenFunction(m, &vfrdma.Options{StateDir: dir})
	require.NoError(t, err)
	defer second.Close()
	assert.Equal(t, left.PDs+left.MRs+left.CQs+left.QPs+left.GIDs, second.Recovered(),
		"every leftover destroyed, the GID binds too (left %+v)", left)
	now := m.Objects()
	assert.Zero(t, now.QPs)
	assert.Zero(t, now.CQs)
	assert.Zero(t, now.MRs)
	assert.Zero(t, now.PDs)
}

// uarModel is the model with its UAR page at a bus address of our choice.
type uarModel struct {
	*pvsim.Device
	pfn uint64
}

func (u uarModel) UARPFN() (uint64, error) { return u.pfn, nil }

// The DSR tells the device where the driver's UAR page is: the function's
// page frame, in the 64-bit field from version 19 on; below 19 a frame
// beyond 32 bits cannot be told, and Open says so.
func TestModelDSRCarriesTheUARPageFrame(t *testing.T) {
	for _, tc := range []struct {
		version uint32
		pfn     uint64
		bad     bool
	}{
		{17, 0xfe800, false},
		{18, 1 << 40, true},
		{19, 1 << 40, false},
		{20, 1<<52 + 3, false},
	} {
		m, err := pvsim.New(vmware(tc.version))
		require.NoError(t, err)
		d, err := vfrdma.OpenFunction(uarModel{m, tc.pfn}, nil)
		if tc.bad {
			assert.ErrorContains(t, err, "uar_pfn", "v%d", tc.version)
			m.Close()
			continue
		}
		require.NoError(t, err, "v%d", tc.version)
		assert.Equal(t, tc.pfn, m.State().UARPFN, "v%d", tc.version)
		require.NoError(t, d.Close())
	}
}

// Every command waits for the device's answer, destroys included: on a
// device that answers after the REQUEST write (the model 2 ms late), a
// Close that returned before the device destroyed the QP freed rings the
// device still read (DMA faults, writes into freed memory on hardware).
func TestModelDestroyWaitsForTheDevicesAnswer(t *testing.T) {
	ctx := ctxT(t)
	cfg := vmware(20)
	cfg.CommandDelay = 2 * time.Millisecond
	d, m := openModel(t, cfg, nil)
	for range 3 {
		p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
		_, err := p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(4096, 64)}}, {WRID: 3, SGEs: []vfrdma.SGE{p.mr.SGE(8192, 64)}}}, 0)
		require.NoError(t, err)
		_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, 0)
		require.NoError(t, err)
		waitWCs(t, ctx, p.cq, 2)
		// A receive stays posted: the QP's destruction flushes it.
		_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 4, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, 0)
		require.NoError(t, err)
		for _, q := range []*vfrdma.QP{p.a, p.b} {
			require.NoError(t, q.Close())
		}
		require.NoError(t, p.mr.Close())
		require.NoError(t, p.cq.Close())
		require.NoError(t, p.pd.Close())
	}
	require.NoError(t, d.Close())
	st := m.Stats()
	assert.Zero(t, st.DMAFaults, "%+v", st)
	assert.Zero(t, st.RingFaults, "%+v", st)
	assert.Equal(t, pvsim.Objects{}, m.Objects())
}

// A QP the device fails (QP_FATAL) is in ERR and each of its outstanding
// requests completes once, with WR_FLUSH_ERR; its posts are refused.
func TestModelQPFatalFlushesEachRequestOnce(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	var recvs []vfrdma.RecvWR
	for i := range 5 {
		recvs = append(recvs, vfrdma.RecvWR{WRID: uint64(10 + i), SGEs: []vfrdma.SGE{p.mr.SGE(4096+i*64, 64)}})
	}
	_, err := p.a.PostRecv(recvs, 0)
	require.NoError(t, err)
	info, ok := m.QPByNumber(p.a.QPN())
	require.True(t, ok)
	require.NoError(t, m.ErrorQP(info.Handle))
	seen := map[uint64]int{}
	for _, wc := range waitWCs(t, ctx, p.cq, 5) {
		assert.Equal(t, vfrdma.WCFlushErr, wc.Status, "%+v", wc)
		seen[wc.WRID]++
	}
	assert.Equal(t, map[uint64]int{10: 1, 11: 1, 12: 1, 13: 1, 14: 1}, seen)
	time.Sleep(50 * time.Millisecond)
	n, err := p.cq.Poll(make([]vfrdma.WC, 8))
	require.NoError(t, err)
	assert.Zero(t, n, "no second completion")
	assert.Equal(t, vfrdma.StateErr, p.a.State())
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}}}, 0)
	assert.ErrorIs(t, err, vfrdma.ErrQPState)
}

// The device's SRQ_LIMIT_REACHED is the SRQ's low-watermark event: it
// arrives once, and the driver's own count raises no second one.
func TestModelDeviceSRQLimitIsTheWatermarkEventOnce(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	cq, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: 16, CQ: cq})
	require.NoError(t, err)
	mr, err := pd.AllocMR(ctx, 1<<14, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	recvs := make([]vfrdma.RecvWR, 8)
	for i := range recvs {
		recvs[i] = vfrdma.RecvWR{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(i*64, 64)}}
	}
	_, err = srq.PostRecv(recvs, 0)
	require.NoError(t, err)
	require.NoError(t, srq.SetLowWatermark(4))
	require.NoError(t, m.Raise(vfrdma.EventSRQLimitReached, srq.Handle()))
	next := func() vfrdma.AsyncEvent {
		select {
		case ev := <-d.AsyncEvents():
			return ev
		case <-ctx.Done():
			require.FailNow(t, "no async event")
		}
		return vfrdma.AsyncEvent{}
	}
	assert.Same(t, srq, next().SRQ)
	select {
	case e := <-srq.LowWatermarkEvents():
		assert.Equal(t, 4, e.Watermark)
	case <-ctx.Done():
		require.FailNow(t, "no watermark event")
	}
	require.NoError(t, m.Raise(vfrdma.EventSRQLimitReached, srq.Handle()))
	next()
	assert.Empty(t, srq.LowWatermarkEvents(), "disarmed: no second event")
}

// Rule: the POLL doorbell's pace defaults by device: DefaultPollPace on
// QEMU's, none (every empty poll, as the reference provider) on VMware's;
// Options.PollPace sets it, a negative one turns it off. Seen as the POLL
// doorbells that a run of empty polls rings.
func TestThePollPaceDefaultsByDevice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   pvsim.Config
		pace  time.Duration
		paced bool
	}{
		{"QEMU, default", pvsim.Config{QEMU: true}, 0, true},
		{"VMware, default", vmware(20), 0, false},
		{"QEMU, off", pvsim.Config{QEMU: true}, -1, false},
		{"VMware, set", vmware(20), time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := pvsim.New(tc.cfg)
			require.NoError(t, err)
			d, err := vfrdma.OpenFunction(m, &vfrdma.Options{PollDoorbell: true, PollPace: tc.pace})
			require.NoError(t, err)
			t.Cleanup(func() { d.Close(); m.Close() })
			cq, err := d.CreateCQ(t.Context(), 16)
			require.NoError(t, err)
			wcs := make([]vfrdma.WC, 4)
			const polls = 200 // a paced poll is a few loads: 200 take far less than 50 µs a piece
			for range polls {
				_, err := cq.Poll(wcs)
				require.NoError(t, err)
			}
			if tc.paced {
				assert.Less(t, cq.Stats().Doorbells, uint64(polls/2), "paced: far fewer POLL doorbells than empty polls")
			} else {
				assert.EqualValues(t, polls, cq.Stats().Doorbells, "a POLL doorbell per empty poll")
			}
		})
	}
}

// Rule: CQ.Wait's spin defaults by device: DefaultSpin on VMware's, none
// on QEMU's (whose device work runs on the cores a spinning guest takes);
// Options.Spin sets it, and a negative one turns it off. A CQ reports it
// (CQ.Spin), and a wait set of CQs takes it unless told otherwise.
func TestTheWaitSpinDefaultsByDevice(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
		spin time.Duration
		want time.Duration
	}{
		{"VMware, default", vmware(20), 0, vfrdma.DefaultSpin},
		{"QEMU, default", pvsim.Config{QEMU: true}, 0, 0},
		{"VMware, set", vmware(18), 3 * time.Millisecond, 3 * time.Millisecond},
		{"QEMU, set", pvsim.Config{QEMU: true}, time.Millisecond, time.Millisecond},
		{"VMware, off", vmware(20), -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := pvsim.New(tc.cfg)
			require.NoError(t, err)
			d, err := vfrdma.OpenFunction(m, &vfrdma.Options{Spin: tc.spin})
			require.NoError(t, err)
			t.Cleanup(func() { d.Close(); m.Close() })
			cq, err := d.CreateCQ(t.Context(), 16)
			require.NoError(t, err)
			assert.Equal(t, tc.want, cq.Spin())
			ws, err := event.NewWaitSet(event.Chan)
			require.NoError(t, err)
			require.NoError(t, ws.Add(cq.Source()))
			assert.Equal(t, tc.want, ws.Spin(), "the wait set's spin")
			ws.SetSpin(time.Second)
			assert.Equal(t, time.Second, ws.Spin(), "set on the wait set")
			ws.SetSpin(0)
			assert.Zero(t, ws.Spin(), "no spin, set on the wait set, whatever its members ask")
			require.NoError(t, ws.Remove(cq.Source()))
			require.NoError(t, ws.Close())
		})
	}
}
