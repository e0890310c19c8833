package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/rings"
)

// stressDevice is the fake device of the shutdown stress test: a goroutine
// that takes the sends published on its QPs and completes them on their
// CQs, raising the CQ vector. It lets go of an object when the driver's
// DESTROY reaches it (fakeCmds.forget), as a device does, and never
// touches it after.
type stressDevice struct {
	mu  sync.Mutex
	qps map[uint32]*stressQP // by handle
	cqs map[uint32]*rings.Producer
}

type stressQP struct {
	qp *QP
	sq *rings.Consumer
	cq uint32
}

func (s *stressDevice) forget(kind string, h uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch kind {
	case kindQP:
		delete(s.qps, h)
	case kindCQ:
		delete(s.cqs, h)
	}
}

// step completes what the QPs have published; it reports whether it did
// anything.
func (s *stressDevice) step(cqData map[uint32][]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	did := false
	for _, q := range s.qps {
		prod := s.cqs[q.cq]
		if prod == nil {
			continue
		}
		ready, err := q.sq.Ready()
		if err != nil || ready == 0 {
			continue
		}
		free, err := prod.Free()
		if err != nil {
			continue
		}
		k := min(ready, free)
		for i := 0; i < k; i++ {
			e := rings.CQE{WRID: binary.LittleEndian.Uint64(q.qp.sq.Slot(q.sq.Slot(i))), QP: uint64(q.qp.handle)}
			rings.PutCQE(cqData[q.cq][prod.Next(0)*CQESize:], &e)
			prod.Advance(1)
		}
		q.sq.Consume(k)
		prod.Publish()
		did = did || k > 0
	}
	return did
}

// stressLedger records, per QP, the wr_ids posted and those completed.
type stressLedger struct {
	mu     sync.Mutex
	posted map[uint32]map[uint64]bool
	done   map[uint32]map[uint64]int
}

func (l *stressLedger) post(qpn uint32, id uint64) {
	l.mu.Lock()
	l.posted[qpn][id] = true
	l.mu.Unlock()
}

func (l *stressLedger) complete(wcs []WC) {
	l.mu.Lock()
	for _, wc := range wcs {
		if l.done[wc.QPN] == nil {
			l.done[wc.QPN] = map[uint64]int{}
		}
		l.done[wc.QPN][wc.WRID]++
	}
	l.mu.Unlock()
}

// The shutdown stress test: goroutines post (sends and receives, deferred
// and not), poll and wait (CQ.Wait, a poll set, a wait set, a counter)
// while another closes QPs, sets and the device at random moments, over
// hundreds of rounds. Every round: no fault and no race (ring memory is
// poisoned where the driver frees it: a call that touched it after would
// race with the poisoning under -race); no wr_id completed twice or
// completed without having been posted; every wr_id posted was completed
// or was still outstanding when its CQ went; where the closer drains
// before closing the device, every wr_id posted completed exactly once;
// every goroutine returned, and none is left behind (goleak).
func TestShutdownStress(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	var posted, completed int
	for round := range rounds {
		p, c := stressRound(t, round, round%2 == 0)
		posted, completed = posted+p, completed+c
		if t.Failed() {
			t.Fatalf("round %d failed", round)
		}
	}
	t.Logf("%d rounds: %d work requests posted, %d completed", rounds, posted, completed)
	require.NotZero(t, completed, "nothing completed: the test tested nothing")
}

// stressRound runs one round and returns how many work requests were
// posted and completed.
func stressRound(t *testing.T, round int, drainFirst bool) (posted, completed int) {
	rng := rand.New(rand.NewPCG(uint64(round), 7))
	l := newLCDevice(t)
	dev := &stressDevice{qps: map[uint32]*stressQP{}, cqs: map[uint32]*rings.Producer{}}
	l.cmds.forget = dev.forget
	const nCQ, nQP, depth = 2, 4, 32
	cqs := make([]*CQ, nCQ)
	cqData := map[uint32][]byte{}
	for i := range cqs {
		var prod *rings.Producer
		cqs[i], prod = l.addCQ(t, uint32(5+i), 4*depth*nQP)
		dev.cqs[cqs[i].handle] = prod
		cqData[cqs[i].handle] = cqs[i].data
	}
	counter := event.NewCounter()
	qps := make([]*QP, nQP)
	ledger := &stressLedger{posted: map[uint32]map[uint64]bool{}, done: map[uint32]map[uint64]int{}}
	for i := range qps {
		cq := cqs[i%nCQ]
		var sq *rings.Consumer
		qps[i], sq = l.addQP(t, uint32(0x100+i), cq, depth)
		if i == 0 {
			require.NoError(t, counter.Hold())
			qps[i].sendCntr = counter
		}
		dev.qps[qps[i].handle] = &stressQP{qp: qps[i], sq: sq, cq: cq.handle}
		ledger.posted[qps[i].qpn] = map[uint64]bool{}
	}
	ps := event.NewPollSet[int]()
	ws, err := event.NewWaitSet(event.Chan)
	require.NoError(t, err)
	for i, cq := range cqs {
		require.NoError(t, ps.Add(cq.Source(), i))
		require.NoError(t, ws.Add(cq.Source()))
	}

	var wg sync.WaitGroup
	stopDev := make(chan struct{})
	errs := make(chan error, 64)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	// The device.
	wg.Go(func() {
		for {
			select {
			case <-stopDev:
				return
			default:
			}
			if dev.step(cqData) {
				l.irq.raise()
			}
			time.Sleep(20 * time.Microsecond)
		}
	})
	// A poster per QP: sends (some deferred, then flushed) and receives.
	for _, qp := range qps {
		wg.Go(func() {
			var id uint64
			for i := 0; ; i++ {
				var err error
				var n int
				switch i % 4 {
				case 0, 1:
					n, err = qp.PostSend(l.send(id), FlagDefer)
				case 2:
					n, err = qp.PostSend(l.send(id), 0)
				case 3:
					n, err = qp.PostRecv([]RecvWR{{WRID: id}}, 0)
					if err == nil {
						err = qp.Ring()
					}
				}
				if n == 1 {
					ledger.post(qp.qpn, id)
					id++
				}
				switch {
				case err == nil:
				case errors.Is(err, ErrQueueFull):
					time.Sleep(10 * time.Microsecond)
				case errors.Is(err, ErrClosed), errors.Is(err, ErrQPState):
					return
				default:
					fail(err)
					return
				}
			}
		})
	}
	// A poller per CQ: Poll, and Wait when it is empty.
	for _, cq := range cqs {
		wg.Go(func() {
			wcs := make([]WC, 16)
			for {
				n, err := cq.Poll(wcs)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					fail(err)
					return
				}
				ledger.complete(wcs[:n])
				if n > 0 {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				err = cq.Wait(ctx)
				cancel()
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					fail(err)
					return
				}
			}
		})
	}
	// The sets' and the counter's users: each stops at ErrClosed or when
	// told to.
	stopSets := make(chan struct{})
	wg.Go(func() {
		out := make([]int, 4)
		for {
			select {
			case <-stopSets:
				return
			default:
			}
			if _, err := ps.Poll(out); err != nil && !errors.Is(err, ErrClosed) {
				fail(err)
				return
			}
			time.Sleep(50 * time.Microsecond)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stopSets:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			err := ws.Wait(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return // the set closed, or a member did
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stopSets:
				return
			default:
			}
			_, _ = counter.Ready(false, nil)
			time.Sleep(50 * time.Microsecond)
		}
	})

	// The closer.
	time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
	for i, qp := range qps {
		switch rng.IntN(3) {
		case 0:
			require.NoError(t, qp.Close(), "QP %d", i)
		case 1:
			require.NoError(t, qp.SetError(context.Background()), "QP %d", i)
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
	}
	closeWS := func() {
		for _, cq := range cqs {
			_ = ws.Remove(cq.Source())
		}
		require.NoError(t, ws.Close())
	}
	if rng.IntN(2) == 0 {
		closeWS()
	}
	if drainFirst {
		// Every QP closed, and its completions polled before the device
		// goes: then every post completed exactly once.
		for _, qp := range qps {
			require.NoError(t, qp.Close())
		}
		deadline := time.Now().Add(10 * time.Second)
		for _, qp := range qps {
			for qp.sq.OutstandingP()+qp.rq.OutstandingP() > 0 {
				require.True(t, time.Now().Before(deadline), "QP %#x never drained", qp.qpn)
				time.Sleep(50 * time.Microsecond)
			}
		}
	}
	require.NoError(t, l.d.Close())
	close(stopSets)
	close(stopDev)
	wg.Wait()
	closeWS()
	close(errs)
	for err := range errs {
		t.Errorf("round %d: %v", round, err)
	}

	// The ledger.
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	for _, qp := range qps {
		ids, done := ledger.posted[qp.qpn], ledger.done[qp.qpn]
		for id, k := range done {
			if k != 1 || !ids[id] {
				t.Errorf("round %d: QP %#x wr_id %d completed %d times, posted %v", round, qp.qpn, id, k, ids[id])
			}
		}
		left := qp.sq.OutstandingP() + qp.rq.OutstandingP()
		if len(done)+left != len(ids) {
			t.Errorf("round %d: QP %#x: %d posted, %d completed, %d outstanding when its CQ went", round, qp.qpn, len(ids), len(done), left)
		}
		if drainFirst && left != 0 {
			t.Errorf("round %d: QP %#x: %d never completed", round, qp.qpn, left)
		}
		posted, completed = posted+len(ids), completed+len(done)
	}
	return posted, completed
}
