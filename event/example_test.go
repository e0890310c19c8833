//go:build !guest

package event_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The examples run on the device model (package pvsim); with a NIC, open
// it with vfrdma.Open("0000:00:10.1", nil) instead.

// One goroutine serves many CQs: a wait set to sleep on all of them at
// once, a poll set to find the ones with completions. Four RC connections
// of one device, each QP with a CQ of its own, and a message on two of
// them.
func ExampleWaitSet() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := pvsim.New(pvsim.Config{})
	if err != nil {
		log.Fatal(err)
	}
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		log.Fatal(err)
	}
	pd, err := d.AllocPD(ctx)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.AllocMR(ctx, 8192, vfrdma.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	// Connection i: sender i with CQ cqs[2i], receiver i with cqs[2i+1],
	// a receive posted into 256 bytes at 4096+256i.
	const conns = 4
	var cqs []*vfrdma.CQ
	var senders []*vfrdma.QP
	for i := range conns {
		var qps [2]*vfrdma.QP
		for j := range qps {
			cq, err := d.CreateCQ(ctx, 16)
			if err != nil {
				log.Fatal(err)
			}
			cqs = append(cqs, cq)
			if qps[j], err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true}); err != nil {
				log.Fatal(err)
			}
		}
		if err := qps[0].Connect(ctx, vfrdma.Remote{QPN: qps[1].QPN(), GID: d.GID()}, 0); err != nil {
			log.Fatal(err)
		}
		if err := qps[1].Connect(ctx, vfrdma.Remote{QPN: qps[0].QPN(), GID: d.GID()}, 0); err != nil {
			log.Fatal(err)
		}
		if _, err := qps[1].PostRecv([]vfrdma.RecvWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(4096+256*i, 256)}}}, 0); err != nil {
			log.Fatal(err)
		}
		senders = append(senders, qps[0])
	}

	ws, err := event.NewWaitSet(event.FD) // or event.Chan, event.Yield
	if err != nil {
		log.Fatal(err)
	}
	ps := event.NewPollSet[int]() // each CQ's context: its index in cqs
	for i, cq := range cqs {
		if err := errors.Join(ws.Add(cq.Source()), ps.Add(cq.Source(), i)); err != nil {
			log.Fatal(err)
		}
	}

	for _, i := range []int{1, 3} {
		n := copy(mr.Bytes()[256*i:], fmt.Sprintf("hello on connection %d", i))
		if _, err := senders[i].PostSend([]vfrdma.SendWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(256*i, n)}}}, 0); err != nil {
			log.Fatal(err)
		}
	}
	// The loop: poll the CQs the poll set names; when it names none, sleep
	// on the wait set (its Wait arms every CQ and looks again before it
	// sleeps, so no completion is slept through). Four completions: two
	// sends, two receives.
	ready := make([]int, len(cqs))
	wcs := make([]vfrdma.WC, 4)
	var got []string
	for left := 4; left > 0; {
		n, err := ps.Poll(ready)
		if err != nil {
			log.Fatal(err)
		}
		if n == 0 {
			if err := ws.Wait(ctx); err != nil {
				log.Fatal(err)
			}
			continue
		}
		for _, c := range ready[:n] {
			k, err := cqs[c].Poll(wcs)
			if err != nil {
				log.Fatal(err)
			}
			for _, wc := range wcs[:k] {
				if wc.Status != vfrdma.WCSuccess {
					log.Fatalf("%v of WR %d: %v", wc.Opcode, wc.WRID, wc.Status)
				}
				if wc.Opcode == vfrdma.WCRecv {
					off := 4096 + 256*int(wc.WRID)
					got = append(got, fmt.Sprintf("CQ %d: %s", c, mr.Bytes()[off:off+int(wc.ByteLen)]))
				}
			}
			left -= k
		}
	}
	slices.Sort(got)
	for _, s := range got {
		fmt.Println(s)
	}
	// A set with members refuses Close: take the CQs out first.
	for _, cq := range cqs {
		if err := errors.Join(ws.Remove(cq.Source()), ps.Remove(cq.Source())); err != nil {
			log.Fatal(err)
		}
	}
	if err := errors.Join(ws.Close(), ps.Close(), d.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// CQ 3: hello on connection 1
	// CQ 7: hello on connection 3
}

// Counters instead of completions: a service that only needs to know how
// many sends and receives are done binds counters to its QPs and lets the
// counters drive the QPs' CQs, which nobody else polls.
func ExampleCounter() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := pvsim.New(pvsim.Config{})
	if err != nil {
		log.Fatal(err)
	}
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		log.Fatal(err)
	}
	pd, err := d.AllocPD(ctx)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.AllocMR(ctx, 8192, vfrdma.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	sendCQ, err := d.CreateCQ(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	recvCQ, err := d.CreateCQ(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	sends, recvs := event.NewCounter(), event.NewCounter()
	a, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: sendCQ, RecvCQ: sendCQ, SendCounter: sends, SignalAll: true})
	if err != nil {
		log.Fatal(err)
	}
	b, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: recvCQ, RecvCQ: recvCQ, RecvCounter: recvs, SignalAll: true})
	if err != nil {
		log.Fatal(err)
	}
	// Nobody polls the CQs: in CQCounted mode the counters take their
	// completions.
	if err := errors.Join(sendCQ.SetMode(vfrdma.CQCounted), recvCQ.SetMode(vfrdma.CQCounted),
		sends.Drive(sendCQ.Source()), recvs.Drive(recvCQ.Source())); err != nil {
		log.Fatal(err)
	}
	if err := a.Connect(ctx, vfrdma.Remote{QPN: b.QPN(), GID: d.GID()}, 0); err != nil {
		log.Fatal(err)
	}
	if err := b.Connect(ctx, vfrdma.Remote{QPN: a.QPN(), GID: d.GID()}, 0); err != nil {
		log.Fatal(err)
	}

	// Eight receives, then eight sends of 64 bytes, each as one chain.
	const n = 8
	rwrs := make([]vfrdma.RecvWR, n)
	swrs := make([]vfrdma.SendWR, n)
	for i := range n {
		rwrs[i] = vfrdma.RecvWR{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(4096+64*i, 64)}}
		swrs[i] = vfrdma.SendWR{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(64*i, 64)}}
	}
	if _, err := b.PostRecv(rwrs, 0); err != nil {
		log.Fatal(err)
	}
	if _, err := a.PostSend(swrs, 0); err != nil {
		log.Fatal(err)
	}
	// Wait returns once the value reaches n, and fails if the error value
	// moves (a completion in error).
	if err := errors.Join(recvs.Wait(ctx, n), sends.Wait(ctx, n)); err != nil {
		log.Fatal(err)
	}
	fmt.Println("sends:", sends.Value(), "errors:", sends.Errors())
	fmt.Println("receives:", recvs.Value(), "errors:", recvs.Errors())
	// The device first: a counter that a QP counts into refuses Close.
	if err := errors.Join(d.Close(), sends.Close(), recvs.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// sends: 8 errors: 0
	// receives: 8 errors: 0
}
