package firmware

import (
	"errors"
	"syscall"
	"testing"
)

func TestQuirksFor(t *testing.T) {
	c := qemuCaps()
	if q := QuirksFor(17, &c); !q.Emulated || !q.NoAsyncEvents || !q.CQArmBoth || q.SRQSwap != SRQSwapUnknown || q.CreateQPV2() || q.PFN64() {
		t.Errorf("QEMU caps: %+v", q)
	}
	c.VendorID, c.VendorPartID, c.PageSizeCap = 0x15ad, 0x0820, PageSize
	q := QuirksFor(20, &c)
	if q.Emulated || q.NoAsyncEvents || q.CQArmBoth || !q.CreateQPV2() || !q.PFN64() {
		t.Errorf("vendor caps: %+v", q)
	}
	if q := QuirksFor(19, &c); !q.PFN64() || q.CreateQPV2() {
		t.Errorf("version 19: %+v", q)
	}
}

func TestCQArm(t *testing.T) {
	qemu := Quirks{CQArmBoth: true}
	spec := Quirks{}
	for _, tc := range []struct {
		q    Quirks
		sol  bool
		want uint32
	}{
		{qemu, false, 0x60000000}, {qemu, true, 0x60000000},
		{spec, false, 0x40000000}, {spec, true, 0x20000000},
	} {
		if got := tc.q.CQArm(tc.sol); got != tc.want {
			t.Errorf("%+v solicited=%v: %#x, want %#x", tc.q, tc.sol, got, tc.want)
		}
	}
}

func TestProbeSRQSwap(t *testing.T) {
	// QEMU: detected even with a handle that names no SRQ (the header is
	// written on failure too), and cached.
	b := newBench(t, benchOpts{})
	s, err := b.ch.ProbeSRQSwap(bg, 1234)
	if err != nil || s != SRQSwapYes || b.ch.Quirks().SRQSwap != SRQSwapYes {
		t.Fatalf("QEMU probe: %v, %v", s, err)
	}
	n := len(b.dev.log)
	if s, _ := b.ch.ProbeSRQSwap(bg, 1234); s != SRQSwapYes || len(b.dev.log) != n {
		t.Error("probe not cached")
	}

	// A device following the interface: the probe is a modify that changes
	// nothing.
	sp := newBench(t, benchOpts{spec: true})
	pd, _ := sp.ch.CreatePD(bg, 0)
	dir, _ := sp.ringObject(1)
	srq, err := sp.ch.CreateSRQ(bg, CreateSRQRequest{PDirDMA: dir, PDHandle: pd, NChunks: 2, Attr: SRQAttr{MaxWR: 16, MaxSGE: 1, SRQLimit: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := sp.ch.ProbeSRQSwap(bg, srq); err != nil || s != SRQSwapNo {
		t.Fatalf("spec probe: %v, %v", s, err)
	}
	if a := sp.dev.srqAttr[srq].attr; a.SRQLimit != 3 {
		t.Errorf("the probe changed the SRQ: %+v", a)
	}
	if q := sp.ch.Quirks(); q.Emulated {
		t.Error("spec device taken for QEMU")
	}
}

func TestQuerySRQFirstCallErrors(t *testing.T) {
	// The first QuerySRQ on QEMU is the probe; its failure is the query's.
	b := newBench(t, benchOpts{})
	_, err := b.ch.QuerySRQ(bg, 77)
	var oe *OpError
	if !errors.Is(err, syscall.EINVAL) || !errors.As(err, &oe) || oe.Op != "QUERY_SRQ" || oe.Status != 0xFFFFFFEA {
		t.Errorf("%v", err)
	}
	if b.ch.Quirks().SRQSwap != SRQSwapYes {
		t.Error("swap not recorded")
	}
	// Later queries go as code 18 and are reported as QUERY_SRQ.
	_, err = b.ch.QuerySRQ(bg, 77)
	if !errors.Is(err, syscall.EINVAL) || !errors.As(err, &oe) || oe.Op != "QUERY_SRQ (sent as code 18, QEMU swap)" {
		t.Errorf("%v", err)
	}
	if last := b.dev.log[len(b.dev.log)-1]; last != CmdModifySRQ {
		t.Errorf("sent code %d", last)
	}
	// A modify QEMU refuses (it only takes the limit) fails loudly instead
	// of running a query and "succeeding".
	if err := b.ch.ModifySRQ(bg, ModifySRQRequest{SRQHandle: 0, AttrMask: SRQAttrMaxWR, Attr: SRQAttr{MaxWR: 8}}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("max_wr modify: %v", err)
	}
}

// TestModifySRQOnQEMUWithoutQuirk shows the trap the quirk avoids: code 18
// on QEMU runs a query and reports success without modifying anything.
func TestModifySRQOnQEMUWithoutQuirk(t *testing.T) {
	b := newBench(t, benchOpts{})
	pd, _ := b.ch.CreatePD(bg, 0)
	dir, _ := b.ringObject(1)
	srq, _ := b.ch.CreateSRQ(bg, CreateSRQRequest{PDirDMA: dir, PDHandle: pd, NChunks: 2, Attr: SRQAttr{MaxWR: 16, MaxSGE: 1, SRQLimit: 3}})
	if err := b.ch.Exec(bg, ModifySRQRequest{SRQHandle: srq, AttrMask: SRQAttrLimit, Attr: SRQAttr{SRQLimit: 9}}, nil); err != nil {
		t.Fatal(err)
	}
	if b.dev.srqAttr[srq].attr.SRQLimit != 3 {
		t.Fatal("the fake does not model the swap")
	}
	if err := b.ch.ModifySRQ(bg, ModifySRQRequest{SRQHandle: srq, AttrMask: SRQAttrLimit, Attr: SRQAttr{SRQLimit: 9}}); err != nil {
		t.Fatal(err)
	}
	if b.dev.srqAttr[srq].attr.SRQLimit != 9 {
		t.Error("ModifySRQ did not modify")
	}
}
