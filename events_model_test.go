package vfrdma_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// An event the device wrote for a QP, CQ or SRQ that was then destroyed,
// taken from the ring only after a new object got its handle, is not the
// new object's: the driver delivers it naming no object, counts it stale,
// and leaves the new one as it is; the new object's own first event,
// written right after its creation, is its. The async goroutine is held
// (HookAsyncDispatch) while the old object's event is written and the
// object destroyed and replaced. QEMU raises no events: the model
// at versions 19 (QP handles are QP numbers) and 20.

// staleVersions are the interface versions the stale-event rules run at.
var staleVersions = []uint32{19, 20}

// heldAsync is a driver on the model whose async goroutine a test hook
// can hold.
type heldAsync struct {
	d       *vfrdma.Device
	m       *pvsim.Device
	in      chan struct{} // closed once the hook holds the goroutine
	gate    chan struct{} // closed to let it go
	release func()
}

// holdInfo is the info of the spurious COMM_EST that the hook holds
// the goroutine on: a handle no QP has.
const holdInfo = 0xfff0

func openHeldAsync(t *testing.T, version uint32) *heldAsync {
	h := &heldAsync{in: make(chan struct{}), gate: make(chan struct{})}
	var once sync.Once
	h.release = func() { once.Do(func() { close(h.gate) }) }
	h.d, h.m = openModel(t, vmware(version), nil)
	vfrdma.HookAsyncDispatch(t, h.d, func(ev vfrdma.AsyncEvent) {
		if ev.Type == vfrdma.EventCommEst && ev.Info == holdInfo {
			close(h.in)
			<-h.gate
		}
	})
	t.Cleanup(h.release) // before the device's Close, which waits for the goroutine
	return h
}

// hold raises the spurious COMM_EST and waits until the hook holds
// the goroutine: the events raised after it wait in the ring.
func (h *heldAsync) hold(t *testing.T, ctx context.Context) {
	t.Helper()
	require.NoError(t, h.m.Raise(vfrdma.EventCommEst, holdInfo))
	select {
	case <-h.in:
	case <-ctx.Done():
		require.FailNow(t, "the hook never held the async goroutine")
	}
}

// next returns the next delivered event of type typ.
func (h *heldAsync) next(t *testing.T, ctx context.Context, typ vfrdma.AsyncEventType) vfrdma.AsyncEvent {
	t.Helper()
	for {
		select {
		case ev := <-h.d.AsyncEvents():
			if ev.Type == typ {
				return ev
			}
		case <-ctx.Done():
			require.FailNow(t, "no event", "%v", typ)
		}
	}
}

func (h *heldAsync) stale(t *testing.T) uint64 {
	t.Helper()
	st, err := h.d.AsyncStats()
	require.NoError(t, err)
	return st.Stale
}

func TestAStaleQPEventLeavesTheNewQPWithItsHandleAlone(t *testing.T) {
	for _, v := range staleVersions {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			ctx := ctxT(t)
			h := openHeldAsync(t, v)
			pd, err := h.d.AllocPD(ctx)
			require.NoError(t, err)
			cq, err := h.d.CreateCQ(ctx, 64)
			require.NoError(t, err)
			cfg := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SendDepth: 8, RecvDepth: 8}
			a, err := pd.CreateQP(ctx, cfg)
			require.NoError(t, err)
			infoA, ok := h.m.QPByNumber(a.QPN())
			require.True(t, ok)

			h.hold(t, ctx)
			require.NoError(t, h.m.ErrorQP(infoA.Handle))
			require.NoError(t, a.Close())
			b, err := pd.CreateQP(ctx, cfg)
			require.NoError(t, err)
			infoB, ok := h.m.QPByNumber(b.QPN())
			require.True(t, ok)
			require.Equal(t, infoA.Handle, infoB.Handle, "the device gave the new QP the old one's handle")
			h.release()

			ev := h.next(t, ctx, vfrdma.EventQPFatal)
			assert.True(t, ev.QP == nil, "the old QP's QP_FATAL names no QP")
			assert.EqualValues(t, infoA.Handle, ev.Info)
			assert.EqualValues(t, 1, h.stale(t))
			assert.Equal(t, vfrdma.StateReset, b.State())
			require.NoError(t, b.Init(ctx), "the new QP goes on")

			// Its own first event (the next the device writes) is its.
			require.NoError(t, h.m.ErrorQP(infoB.Handle))
			ev = h.next(t, ctx, vfrdma.EventQPFatal)
			assert.Same(t, b, ev.QP)
			assert.Equal(t, vfrdma.StateErr, b.State())
			assert.EqualValues(t, 1, h.stale(t))
			require.NoError(t, b.Close())
		})
	}
}

func TestAStaleCQErrLeavesTheNewCQWithItsHandleAlone(t *testing.T) {
	for _, v := range staleVersions {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			ctx := ctxT(t)
			h := openHeldAsync(t, v)
			a, err := h.d.CreateCQ(ctx, 64)
			require.NoError(t, err)

			h.hold(t, ctx)
			require.NoError(t, h.m.OverflowCQ(a.Handle()))
			require.NoError(t, a.Close())
			b, err := h.d.CreateCQ(ctx, 64)
			require.NoError(t, err)
			require.Equal(t, a.Handle(), b.Handle(), "the device gave the new CQ the old one's handle")
			h.release()

			ev := h.next(t, ctx, vfrdma.EventCQErr)
			assert.True(t, ev.CQ == nil, "the old CQ's CQ_ERR names no CQ")
			assert.EqualValues(t, a.Handle(), ev.Info)
			assert.EqualValues(t, 1, h.stale(t))
			n, err := b.Poll(make([]vfrdma.WC, 4))
			assert.NoError(t, err, "the new CQ has not failed")
			assert.Zero(t, n)

			require.NoError(t, h.m.OverflowCQ(b.Handle()))
			ev = h.next(t, ctx, vfrdma.EventCQErr)
			assert.Same(t, b, ev.CQ)
			_, err = b.Poll(make([]vfrdma.WC, 4))
			assert.ErrorIs(t, err, vfrdma.ErrCQOverrun, "its own CQ_ERR fails it")
			require.NoError(t, b.Close())
		})
	}
}

func TestAStaleSRQLimitLeavesTheNewSRQWithItsHandleAlone(t *testing.T) {
	for _, v := range staleVersions {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			ctx := ctxT(t)
			h := openHeldAsync(t, v)
			pd, err := h.d.AllocPD(ctx)
			require.NoError(t, err)
			mr, err := pd.AllocMR(ctx, 1<<14, vfrdma.AccessLocalWrite)
			require.NoError(t, err)
			cq, err := h.d.CreateCQ(ctx, 64)
			require.NoError(t, err)
			cfg := &vfrdma.SRQConfig{Depth: 16, CQ: cq}
			a, err := pd.CreateSRQ(ctx, cfg)
			require.NoError(t, err)

			h.hold(t, ctx)
			require.NoError(t, h.m.Raise(vfrdma.EventSRQLimitReached, a.Handle()))
			require.NoError(t, a.Close())
			b, err := pd.CreateSRQ(ctx, cfg)
			require.NoError(t, err)
			require.Equal(t, a.Handle(), b.Handle(), "the device gave the new SRQ the old one's handle")
			recvs := make([]vfrdma.RecvWR, 8)
			for i := range recvs {
				recvs[i] = vfrdma.RecvWR{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(i*64, 64)}}
			}
			_, err = b.PostRecv(recvs, 0)
			require.NoError(t, err)
			require.NoError(t, b.SetLowWatermark(4)) // armed: 8 available
			h.release()

			ev := h.next(t, ctx, vfrdma.EventSRQLimitReached)
			assert.True(t, ev.SRQ == nil, "the old SRQ's SRQ_LIMIT_REACHED names no SRQ")
			assert.EqualValues(t, 1, h.stale(t))
			assert.Empty(t, b.LowWatermarkEvents(), "no watermark event on the new SRQ")

			require.NoError(t, h.m.Raise(vfrdma.EventSRQLimitReached, b.Handle()))
			ev = h.next(t, ctx, vfrdma.EventSRQLimitReached)
			assert.Same(t, b, ev.SRQ)
			select {
			case e := <-b.LowWatermarkEvents():
				assert.Equal(t, 4, e.Watermark, "its own event is its watermark event")
			case <-ctx.Done():
				require.FailNow(t, "no watermark event")
			}
			require.NoError(t, b.Close())
		})
	}
}
