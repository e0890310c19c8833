//go:build guest

package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// Two QPs share one SRQ: receives posted once are consumed by either,
// every byte is checked, each QP's messages arrive in order, and every
// receive completes once.
func TestSRQ(t *testing.T) {
	d := openGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pd, err := d.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scq, err := d.CreateCQ(ctx, 256)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := d.CreateCQ(ctx, 256)
	if err != nil {
		t.Fatal(err)
	}
	const depth, slot = 64, 2048
	srq, err := pd.CreateSRQ(ctx, &SRQConfig{Depth: depth})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(ctx, depth*slot, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	smr, err := pd.AllocMR(ctx, 2*slot, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	post := func(s int) error {
		_, err := srq.PostRecv([]RecvWR{{WRID: uint64(s), SGEs: []SGE{mr.SGE(s*slot, slot)}}}, 0)
		return err
	}
	// QEMU takes the receiving CQ from the SRQ's newest QP at post time.
	if err := post(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("SRQ post before any QP uses it: %v, want ErrInvalid", err)
	}
	var senders, receivers [2]*QP
	for i := range senders {
		if senders[i], err = pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: scq, RecvCQ: scq}); err != nil {
			t.Fatal(err)
		}
		if receivers[i], err = pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: scq, RecvCQ: rcq, SRQ: srq}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: scq, RecvCQ: scq, SRQ: srq}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("a QP of the SRQ with another receive CQ: %v, want ErrNotSupported (QEMU 7.2)", err)
	}
	for i := range senders {
		if err := senders[i].Connect(ctx, Remote{QPN: receivers[i].QPN(), GID: d.GID()}, 0); err != nil {
			t.Fatal(err)
		}
		if err := receivers[i].Connect(ctx, Remote{QPN: senders[i].QPN(), GID: d.GID()}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := receivers[0].PostRecv([]RecvWR{{WRID: 9, SGEs: []SGE{mr.SGE(0, 64)}}}, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("PostRecv on a QP with an SRQ: %v, want ErrInvalid", err)
	}
	for s := 0; s < depth; s++ {
		if err := post(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("closing an SRQ in use: %v, want ErrBusy", err)
	}

	// Each sender sends n messages; the id (sender, sequence) leads the
	// payload and seeds its pattern.
	const n = 1000
	sent, next := [2]int{}, [2]int{}
	recvd, sendDone := 0, 0
	seen := make(map[uint64]bool)
	wcs := make([]WC, 32)
	for recvd < 2*n {
		for i := range senders {
			if sent[i] < n && sent[i]-next[i] < depth/4 {
				size := 4 + (sent[i]*37)%(slot-4)
				b := smr.Bytes()[i*slot : i*slot+size]
				id := uint32(i<<24 | sent[i])
				binary.LittleEndian.PutUint32(b, id)
				fill(b[4:], int(id))
				if _, err := senders[i].PostSend([]SendWR{{WRID: uint64(id), SGEs: []SGE{smr.SGE(i*slot, size)}}}, 0); err != nil {
					t.Fatal(err)
				}
				sent[i]++
				// One message per sender in flight: its buffer is reused.
				for done := false; !done; {
					k := pollWait(t, scq, wcs[:1])
					if wcs[0].Status != WCSuccess {
						t.Fatalf("send %+v", wcs[0])
					}
					done = k == 1
					sendDone++
				}
			}
		}
		k, err := rcq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 && sent[0] == n && sent[1] == n {
			k = pollWait(t, rcq, wcs)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != WCSuccess || wc.Opcode != WCRecv {
				t.Fatalf("receive %+v", wc)
			}
			if seen[wc.WRID] {
				t.Fatalf("SRQ receive %d completed while not posted", wc.WRID)
			}
			s := int(wc.WRID)
			b := mr.Bytes()[s*slot : s*slot+int(wc.ByteLen)]
			id := binary.LittleEndian.Uint32(b)
			i, seq := int(id>>24), int(id&0xffffff)
			if i > 1 || wc.QPN != receivers[i].QPN() {
				t.Fatalf("message %#x arrived on QP %d, want %d", id, wc.QPN, receivers[min(i, 1)].QPN())
			}
			if seq != next[i] {
				t.Fatalf("QP %d: message %d arrived, want %d (order)", wc.QPN, seq, next[i])
			}
			if err := check(b[4:], int(id)); err != nil {
				t.Fatal(err)
			}
			next[i]++
			recvd++
			if err := post(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := srq.Outstanding(); got != depth {
		t.Fatalf("%d receives outstanding after the traffic, want %d", got, depth)
	}
	st := srq.DoorbellStats()
	t.Logf("SRQ: %d messages from two QPs, %d receive doorbells", recvd, st.Doorbells)
	for i := range senders {
		senders[i].Close()
		receivers[i].Close()
	}
	if err := srq.Close(); err != nil {
		t.Fatalf("closing the SRQ: %v", err)
	}
}
