//go:build !guest

package vfrdma_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The examples run on the device model (package pvsim), so go test runs
// them on any machine and checks what they print. On a machine with the
// NIC, open the device with vfrdma.Open("0000:00:10.1", nil) instead of
// pvsim.New and vfrdma.OpenFunction, its IOMMU group bound to vfio-pci
// (pvctl bind). The README's Go blocks are these examples' bodies.

// Two QPs of one device send each other a message. The receives are
// posted before the send that needs them: an RC SEND that finds no receive
// waits for one (RNR) and a UD datagram is dropped.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := pvsim.New(pvsim.Config{}) // VMware's device, interface version 20
	if err != nil {
		log.Fatal(err)
	}
	d, err := vfrdma.OpenFunction(m, nil) // d.Close closes m
	if err != nil {
		log.Fatal(err)
	}
	pd, err := d.AllocPD(ctx)
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
	cfg := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: sendCQ, RecvCQ: recvCQ, SignalAll: true}
	a, err := pd.CreateQP(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	b, err := pd.CreateQP(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.AllocMR(ctx, 8192, vfrdma.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Connect(ctx, vfrdma.Remote{QPN: b.QPN(), GID: d.GID()}, 0); err != nil {
		log.Fatal(err)
	}
	if err := b.Connect(ctx, vfrdma.Remote{QPN: a.QPN(), GID: d.GID()}, 0); err != nil {
		log.Fatal(err)
	}

	// b's two receives first, then a's two sends: the first deferred (no
	// doorbell), the second (zero bytes) ringing one doorbell for both.
	if _, err := b.PostRecv([]vfrdma.RecvWR{
		{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(4096, 64)}},
		{WRID: 2, SGEs: []vfrdma.SGE{mr.SGE(4096+64, 64)}},
	}, 0); err != nil {
		log.Fatal(err)
	}
	n := copy(mr.Bytes(), "hello")
	if _, err := a.PostSend([]vfrdma.SendWR{{WRID: 3, SGEs: []vfrdma.SGE{mr.SGE(0, n)}}}, vfrdma.FlagDefer); err != nil {
		log.Fatal(err)
	}
	if _, err := a.PostSend([]vfrdma.SendWR{{WRID: 4}}, 0); err != nil {
		log.Fatal(err)
	}

	// Two completions on each CQ, each checked.
	wcs := make([]vfrdma.WC, 2)
	for _, cq := range []*vfrdma.CQ{sendCQ, recvCQ} {
		for got := 0; got < len(wcs); {
			if err := cq.Wait(ctx); err != nil {
				log.Fatal(err)
			}
			k, err := cq.Poll(wcs[got:])
			if err != nil {
				log.Fatal(err)
			}
			got += k
		}
		for _, wc := range wcs {
			if wc.Status != vfrdma.WCSuccess {
				log.Fatalf("%v of WR %d: %v", wc.Opcode, wc.WRID, wc.Status)
			}
			if wc.Opcode == vfrdma.WCRecv { // ByteLen is a receive's
				fmt.Println(wc.Opcode, wc.WRID, wc.ByteLen, "bytes")
			} else {
				fmt.Println(wc.Opcode, wc.WRID)
			}
		}
	}
	sends, _ := a.DoorbellStats()
	fmt.Printf("%d sends, %d doorbell; received %q\n", sends.WQEs, sends.Doorbells, mr.Bytes()[4096:4096+n])
	if err := d.Close(); err != nil { // closes every object of d
		log.Fatal(err)
	}
	// Output:
	// SEND 3
	// SEND 4
	// RECV 1 5 bytes
	// RECV 2 0 bytes
	// 2 sends, 1 doorbell; received "hello"
}

// An RC connection between two ends, made as two processes on two machines
// make it: each opens its device (here, a model of it; the two models
// share a fabric), creates its QP, posts its receive, and only then tells
// the other its QP number, GID and first packet sequence number. Carrying
// that is up to the application (a TCP connection, a job launcher); here
// it is a copy of a vfrdma.Remote. Then A sends "ping" and B answers
// "pong".
func Example_rc() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fabric := pvsim.NewFabric() // the network between the two machines

	// One end: its device, a send CQ and a receive CQ, an RC QP in INIT
	// with a receive posted, and a buffer (sends from its first half,
	// receives into its second).
	type end struct {
		d              *vfrdma.Device
		sendCQ, recvCQ *vfrdma.CQ
		qp             *vfrdma.QP
		mr             *vfrdma.MR
	}
	open := func() (*end, error) {
		m, err := pvsim.New(pvsim.Config{Fabric: fabric})
		if err != nil {
			return nil, err
		}
		e := &end{}
		if e.d, err = vfrdma.OpenFunction(m, nil); err != nil { // with a NIC: vfrdma.Open(bdf, nil)
			return nil, err
		}
		pd, err := e.d.AllocPD(ctx)
		if err != nil {
			return nil, err
		}
		if e.sendCQ, err = e.d.CreateCQ(ctx, 16); err != nil {
			return nil, err
		}
		if e.recvCQ, err = e.d.CreateCQ(ctx, 16); err != nil {
			return nil, err
		}
		cfg := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: e.sendCQ, RecvCQ: e.recvCQ, SignalAll: true}
		if e.qp, err = pd.CreateQP(ctx, cfg); err != nil {
			return nil, err
		}
		if e.mr, err = pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite); err != nil {
			return nil, err
		}
		if err := e.qp.Init(ctx); err != nil { // receives may be posted from INIT on
			return nil, err
		}
		_, err = e.qp.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{e.mr.SGE(2048, 2048)}}}, 0)
		return e, err
	}
	// wait returns cq's next n completions, each a success.
	wait := func(cq *vfrdma.CQ, n int) ([]vfrdma.WC, error) {
		wcs := make([]vfrdma.WC, n)
		for got := 0; got < n; {
			if err := cq.Wait(ctx); err != nil {
				return nil, err
			}
			k, err := cq.Poll(wcs[got:])
			if err != nil {
				return nil, err
			}
			for _, wc := range wcs[got : got+k] {
				if wc.Status != vfrdma.WCSuccess {
					return nil, fmt.Errorf("%v of WR %d: %v", wc.Opcode, wc.WRID, wc.Status)
				}
			}
			got += k
		}
		return wcs, nil
	}
	// send sends msg from e's buffer and waits for its completion.
	send := func(e *end, msg string) error {
		n := copy(e.mr.Bytes(), msg)
		if _, err := e.qp.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{e.mr.SGE(0, n)}}}, 0); err != nil {
			return err
		}
		_, err := wait(e.sendCQ, 1)
		return err
	}
	// recv waits for e's receive and returns the message and its sender.
	recv := func(e *end) (string, uint32, error) {
		wcs, err := wait(e.recvCQ, 1)
		if err != nil {
			return "", 0, err
		}
		return string(e.mr.Bytes()[2048 : 2048+wcs[0].ByteLen]), wcs[0].SrcQP, nil
	}

	a, err := open()
	if err != nil {
		log.Fatal(err)
	}
	b, err := open()
	if err != nil {
		log.Fatal(err)
	}
	// The exchange: what each end tells the other. Each picks its own
	// first PSN; the peer's is what it expects to receive.
	aSays := vfrdma.Remote{QPN: a.qp.QPN(), GID: a.d.GID(), PSN: 1000}
	bSays := vfrdma.Remote{QPN: b.qp.QPN(), GID: b.d.GID(), PSN: 2000}
	if err := a.qp.Connect(ctx, bSays, aSays.PSN); err != nil {
		log.Fatal(err)
	}
	if err := b.qp.Connect(ctx, aSays, bSays.PSN); err != nil {
		log.Fatal(err)
	}

	if err := send(a, "ping"); err != nil {
		log.Fatal(err)
	}
	msg, from, err := recv(b)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("B received %q from A's QP: %v\n", msg, from == aSays.QPN)
	if err := send(b, "pong"); err != nil {
		log.Fatal(err)
	}
	if msg, from, err = recv(a); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("A received %q from B's QP: %v\n", msg, from == bSays.QPN)
	if err := errors.Join(a.d.Close(), b.d.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// B received "ping" from A's QP: true
	// A received "pong" from B's QP: true
}

// UD datagrams between two ends: no connection; each send names its
// destination (an address handle for the peer's GID, the peer's QP number
// and Q_Key), and each receive buffer starts with UDHeaderRoom bytes for
// the global route header. The receiver tells the sender its GID, QP
// number and Q_Key, after posting its receive: a datagram that finds no
// receive is dropped.
func Example_ud() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fabric := pvsim.NewFabric()
	const qkey = 0x11111111

	// One end: its device, a CQ, a UD QP ready to send, a buffer.
	type end struct {
		d  *vfrdma.Device
		pd *vfrdma.PD
		cq *vfrdma.CQ
		qp *vfrdma.QP
		mr *vfrdma.MR
	}
	open := func() (*end, error) {
		m, err := pvsim.New(pvsim.Config{Fabric: fabric})
		if err != nil {
			return nil, err
		}
		e := &end{}
		if e.d, err = vfrdma.OpenFunction(m, nil); err != nil { // with a NIC: vfrdma.Open(bdf, nil)
			return nil, err
		}
		if e.pd, err = e.d.AllocPD(ctx); err != nil {
			return nil, err
		}
		if e.cq, err = e.d.CreateCQ(ctx, 16); err != nil {
			return nil, err
		}
		cfg := &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: e.cq, RecvCQ: e.cq, QKey: qkey, SignalAll: true}
		if e.qp, err = e.pd.CreateQP(ctx, cfg); err != nil {
			return nil, err
		}
		if e.mr, err = e.pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite); err != nil {
			return nil, err
		}
		return e, e.qp.Connect(ctx, vfrdma.Remote{}, 0) // UD: INIT, RTR, RTS; no peer
	}
	// wait returns cq's next n completions, each a success.
	wait := func(cq *vfrdma.CQ, n int) ([]vfrdma.WC, error) {
		wcs := make([]vfrdma.WC, n)
		for got := 0; got < n; {
			if err := cq.Wait(ctx); err != nil {
				return nil, err
			}
			k, err := cq.Poll(wcs[got:])
			if err != nil {
				return nil, err
			}
			for _, wc := range wcs[got : got+k] {
				if wc.Status != vfrdma.WCSuccess {
					return nil, fmt.Errorf("%v of WR %d: %v", wc.Opcode, wc.WRID, wc.Status)
				}
			}
			got += k
		}
		return wcs, nil
	}

	sender, err := open()
	if err != nil {
		log.Fatal(err)
	}
	receiver, err := open()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := receiver.qp.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{receiver.mr.SGE(0, vfrdma.UDHeaderRoom+1024)}}}, 0); err != nil {
		log.Fatal(err)
	}
	// What the receiver tells the sender.
	gid, qpn := receiver.d.GID(), receiver.qp.QPN()

	ah, err := sender.pd.CreateAH(vfrdma.AHAttr{DGID: gid})
	if err != nil {
		log.Fatal(err)
	}
	n := copy(sender.mr.Bytes(), "datagram")
	if _, err := sender.qp.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{sender.mr.SGE(0, n)},
		AH: ah, RemoteQPN: qpn, RemoteQKey: qkey}}, 0); err != nil {
		log.Fatal(err)
	}
	if _, err := wait(sender.cq, 1); err != nil {
		log.Fatal(err)
	}
	wcs, err := wait(receiver.cq, 1)
	if err != nil {
		log.Fatal(err)
	}
	wc := wcs[0]
	fmt.Printf("%q, %d bytes with the header room, from the sender's QP: %v\n",
		receiver.mr.Bytes()[vfrdma.UDHeaderRoom:wc.ByteLen], wc.ByteLen, wc.SrcQP == sender.qp.QPN())
	if err := errors.Join(sender.d.Close(), receiver.d.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// "datagram", 48 bytes with the header room, from the sender's QP: true
}

// A shared receive queue (uDAPL's rules) behind two RC connections of a
// server: one pool of receive buffers for both QPs, an event when the pool
// runs low, what each QP consumed. The clients' two QPs are on another
// device of the same fabric.
func ExampleSRQ() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fabric := pvsim.NewFabric()
	open := func() (*vfrdma.Device, error) {
		m, err := pvsim.New(pvsim.Config{Fabric: fabric})
		if err != nil {
			return nil, err
		}
		return vfrdma.OpenFunction(m, nil) // with a NIC: vfrdma.Open(bdf, nil)
	}
	// wait returns cq's next n completions, each a success.
	wait := func(cq *vfrdma.CQ, n int) ([]vfrdma.WC, error) {
		wcs := make([]vfrdma.WC, n)
		for got := 0; got < n; {
			if err := cq.Wait(ctx); err != nil {
				return nil, err
			}
			k, err := cq.Poll(wcs[got:])
			if err != nil {
				return nil, err
			}
			for _, wc := range wcs[got : got+k] {
				if wc.Status != vfrdma.WCSuccess {
					return nil, fmt.Errorf("%v of WR %d: %v", wc.Opcode, wc.WRID, wc.Status)
				}
			}
			got += k
		}
		return wcs, nil
	}

	server, err := open()
	if err != nil {
		log.Fatal(err)
	}
	client, err := open()
	if err != nil {
		log.Fatal(err)
	}
	spd, err := server.AllocPD(ctx)
	if err != nil {
		log.Fatal(err)
	}
	cpd, err := client.AllocPD(ctx)
	if err != nil {
		log.Fatal(err)
	}
	scq, err := server.CreateCQ(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	ccq, err := client.CreateCQ(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	smr, err := spd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	cmr, err := cpd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	// Four receives at most, an event when fewer than two are left.
	srq, err := spd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: 4, LowWatermark: 2, CQ: scq})
	if err != nil {
		log.Fatal(err)
	}
	var sqps, cqps [2]*vfrdma.QP
	for i := range sqps {
		if sqps[i], err = spd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: scq, RecvCQ: scq, SRQ: srq, SignalAll: true}); err != nil {
			log.Fatal(err)
		}
		if cqps[i], err = cpd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: ccq, RecvCQ: ccq, SignalAll: true}); err != nil {
			log.Fatal(err)
		}
	}
	// The pool, posted once for both QPs (on QEMU 7.2, once a QP uses the
	// SRQ), before the clients can send: buffer i is 256 bytes at i*256.
	recvs := make([]vfrdma.RecvWR, 4)
	for i := range recvs {
		recvs[i] = vfrdma.RecvWR{WRID: uint64(i), SGEs: []vfrdma.SGE{smr.SGE(i*256, 256)}}
	}
	if _, err := srq.PostRecv(recvs, 0); err != nil {
		log.Fatal(err)
	}
	for i := range sqps { // each side's QPN and GID, told to the other
		if err := sqps[i].Connect(ctx, vfrdma.Remote{QPN: cqps[i].QPN(), GID: client.GID()}, 0); err != nil {
			log.Fatal(err)
		}
		if err := cqps[i].Connect(ctx, vfrdma.Remote{QPN: sqps[i].QPN(), GID: server.GID()}, 0); err != nil {
			log.Fatal(err)
		}
	}

	// Three messages: two on connection 0, one on connection 1.
	for i, c := range []int{0, 0, 1} {
		n := copy(cmr.Bytes()[i*256:], fmt.Sprintf("message %d on connection %d", i, c))
		if _, err := cqps[c].PostSend([]vfrdma.SendWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{cmr.SGE(i*256, n)}}}, 0); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := wait(ccq, 3); err != nil {
		log.Fatal(err)
	}
	wcs, err := wait(scq, 3)
	if err != nil {
		log.Fatal(err)
	}
	var got []string // in arrival order per connection, none across them
	for _, wc := range wcs {
		off := int(wc.WRID) * 256
		got = append(got, string(smr.Bytes()[off:off+int(wc.ByteLen)]))
	}
	slices.Sort(got)
	for _, msg := range got {
		fmt.Println(msg)
	}

	// One buffer left: the watermark fired (once; it must be set again).
	// Refill with the buffers just consumed, and rearm.
	select {
	case ev := <-srq.LowWatermarkEvents():
		fmt.Printf("low watermark: %d available, watermark %d\n", ev.Available, ev.Watermark)
	case <-ctx.Done():
		log.Fatal(ctx.Err())
	}
	for i, wc := range wcs {
		recvs[i] = vfrdma.RecvWR{WRID: wc.WRID, SGEs: []vfrdma.SGE{smr.SGE(int(wc.WRID)*256, 256)}}
	}
	if _, err := srq.PostRecv(recvs[:len(wcs)], 0); err != nil {
		log.Fatal(err)
	}
	if err := srq.SetLowWatermark(2); err != nil {
		log.Fatal(err)
	}
	q := srq.Query()
	for i, qp := range sqps {
		for _, v := range q.QPs {
			if v.QPN == qp.QPN() {
				fmt.Printf("connection %d consumed %d\n", i, v.Consumed)
			}
		}
	}
	fmt.Printf("%d of %d available\n", q.Available, q.Depth)
	if err := errors.Join(server.Close(), client.Close()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// message 0 on connection 0
	// message 1 on connection 0
	// message 2 on connection 1
	// low watermark: 1 available, watermark 2
	// connection 0 consumed 2
	// connection 1 consumed 1
	// 4 of 4 available
}

// CQ.WaitN waits for a number of completions: it polls into the caller's
// slice, and while it holds fewer, waits as the device's options say
// (Options.Spin on the ring, then asleep on the CQ's interrupt). Here four
// messages from a to b make eight completions on one CQ.
func ExampleCQ_WaitN() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := pvsim.New(pvsim.Config{})
	if err != nil {
		log.Fatal(err)
	}
	d, err := vfrdma.OpenFunction(m, &vfrdma.Options{Spin: 20 * time.Microsecond})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	pd, err := d.AllocPD(ctx)
	if err != nil {
		log.Fatal(err)
	}
	cq, err := d.CreateCQ(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	cfg := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true}
	a, err := pd.CreateQP(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	b, err := pd.CreateQP(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	mr, err := pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Connect(ctx, vfrdma.Remote{QPN: b.QPN(), GID: d.GID()}, 0); err != nil {
		log.Fatal(err)
	}
	if err := b.Connect(ctx, vfrdma.Remote{QPN: a.QPN(), GID: d.GID()}, 0); err != nil {
		log.Fatal(err)
	}
	recvs := make([]vfrdma.RecvWR, 4)
	sends := make([]vfrdma.SendWR, 4)
	for i := range 4 {
		recvs[i] = vfrdma.RecvWR{WRID: uint64(10 + i), SGEs: []vfrdma.SGE{mr.SGE(2048+i*64, 64)}}
		sends[i] = vfrdma.SendWR{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(i*64, 64)}}
	}
	if _, err := b.PostRecv(recvs, 0); err != nil {
		log.Fatal(err)
	}
	if _, err := a.PostSend(sends, 0); err != nil {
		log.Fatal(err)
	}

	wcs := make([]vfrdma.WC, 8)
	n, err := cq.WaitN(ctx, wcs, len(wcs)) // all eight
	if err != nil {
		log.Fatal(err)
	}
	count := map[vfrdma.WCOpcode]int{}
	for _, wc := range wcs[:n] {
		if wc.Status != vfrdma.WCSuccess {
			log.Fatalf("%v of WR %d: %v", wc.Opcode, wc.WRID, wc.Status)
		}
		count[wc.Opcode]++
	}
	fmt.Println(n, "completions:", count[vfrdma.WCSend], "sends,", count[vfrdma.WCRecv], "receives")
	// Output:
	// 8 completions: 4 sends, 4 receives
}
