package pvsim_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

// rcLink is an RC QP on one model connected to one on another, across a
// fabric: a requester a and a responder b.
type rcLink struct {
	ra, rb *raw
	qa, qb *rawQP
	ca, cb *rawCQ
	ma, mb *rawMR
}

// newRCLinks makes n such pairs between two models on fab; the
// requesters use ra (the local ACK timeout, retry_cnt).
func newRCLinks(t *testing.T, fab *pvsim.Fabric, n int, ra rcAttr) []rcLink {
	t.Helper()
	return newRCLinksOn(t, fab, fab, n, ra)
}

// newRCLinksOn is newRCLinks with a's model on fa and b's on fb.
func newRCLinksOn(t *testing.T, fa, fb *pvsim.Fabric, n int, ra rcAttr) []rcLink {
	t.Helper()
	a := newRaw(t, pvsim.Config{Fabric: fa, MAC: [6]byte{2, 0, 0, 0, 0, 1}})
	b := newRaw(t, pvsim.Config{Fabric: fb, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	pa, pb := a.pd(), b.pd()
	ma, mb := a.mr(pa, 1<<16, allAccess), b.mr(pb, 1<<16, allAccess)
	ls := make([]rcLink, n)
	for i := range ls {
		l := &ls[i]
		l.ra, l.rb, l.ma, l.mb = a, b, ma, mb
		l.ca, l.cb = a.cq(64), b.cq(64)
		l.qa = a.qp(pa, firmware.QPTypeRC, l.ca, l.ca, 16, qpOpts{})
		l.qb = b.qp(pb, firmware.QPTypeRC, l.cb, l.cb, 16, qpOpts{})
		l.qa.connect(l.qb.qpn, b.gid, ra)
		l.qb.connect(l.qa.qpn, a.gid, defaultRC())
	}
	return ls
}

func hold(t *testing.T, r *raw) func() {
	t.Helper()
	release, err := r.m.Hold()
	require.NoError(t, err)
	t.Cleanup(release)
	return release
}

// The local ACK timeout declares a loss only where the model lost
// something: a timeout that comes due while the request waits unread in
// a stalled responder's inbox, or while its acknowledgement waits unread
// in the stalled requester's own, retransmits nothing; the send completes
// once the devices run again, however many timeouts came due meanwhile
// (retry_cnt 2: without the rule the third would fail it with
// RETRY_EXC_ERR).
func TestATimeoutWhileTheRequestOrItsAnswerIsInsideTheModelIsNoLoss(t *testing.T) {
	fast := defaultRC()
	fast.timeout, fast.retry = 1, 2 // 8.192 µs, twice
	timeout := 4096 * time.Nanosecond << fast.timeout

	t.Run("request unread at the responder", func(t *testing.T) {
		l := newRCLinks(t, pvsim.NewFabric(), 1, fast)[0]
		l.qb.recv(1, l.mb.sge(0, 64))
		releaseB := hold(t, l.rb)
		l.qa.send(sendWR(1, rings.WRSend, sig, l.ma.sge(0, 8)))
		require.Eventually(t, func() bool {
			s := l.ra.m.Stats()
			return s.Timeouts+s.TimeoutsHeld > uint64(fast.retry)
		}, 10*time.Second, 50*time.Microsecond, "the requester's timer comes due more than retry_cnt times")
		releaseB()
		c := l.ca.wait(1)[0]
		assert.Equal(t, uint32(rings.WCSuccess), c.Status, "%+v", c)
		s := l.ra.m.Stats()
		assert.Zero(t, s.Retransmits)
		assert.Zero(t, s.Timeouts)
		assert.Greater(t, s.TimeoutsHeld, uint64(fast.retry))
		assert.Zero(t, l.rb.m.Stats().Dropped, "no duplicate reached the responder")
	})

	t.Run("answer unread at the requester", func(t *testing.T) {
		l := newRCLinks(t, pvsim.NewFabric(), 1, fast)[0]
		l.qb.recv(1, l.mb.sge(0, 64))
		releaseB := hold(t, l.rb)
		l.qa.send(sendWR(1, rings.WRSend, sig, l.ma.sge(0, 8)))
		releaseA := hold(t, l.ra) // after the send doorbell: the request has left
		releaseB()
		require.Eventually(t, func() bool { return l.rb.m.Stats().Packets == 1 }, 10*time.Second, 50*time.Microsecond,
			"the responder acknowledged")
		// The requester armed its timer before the request left, so its
		// deadline passes within one timeout of the acknowledgement.
		time.Sleep(2 * timeout)
		releaseA()
		c := l.ca.wait(1)[0]
		assert.Equal(t, uint32(rings.WCSuccess), c.Status, "%+v", c)
		s := l.ra.m.Stats()
		assert.Zero(t, s.Retransmits, "the acknowledgement was read before the timer declared a loss")
		assert.Zero(t, s.Timeouts)
		assert.NotZero(t, s.TimeoutsHeld)
		assert.Zero(t, l.ra.m.Stats().Dropped, "no duplicate acknowledgement")
	})
}

// Across processes (two nodes of one fabric directory) a request that
// waits unread in a descheduled peer process is no loss either: it counts
// as inside the model until the peer's device handled it (its notice
// comes back), so the send completes once the peer runs; a request a
// live peer dropped (no such QP there) is handled, and lost: retries end
// in RETRY_EXC_ERR.
func TestATimeoutWhileTheRequestIsWithAPeerProcessIsNoLoss(t *testing.T) {
	fast := defaultRC()
	fast.timeout, fast.retry = 1, 2 // 8.192 µs, twice

	t.Run("request unread in the peer process", func(t *testing.T) {
		fa, fb := twoFabrics(t, "dir")
		l := newRCLinksOn(t, fa, fb, 1, fast)[0]
		l.qb.recv(1, l.mb.sge(0, 64))
		releaseB := hold(t, l.rb)
		l.qa.send(sendWR(1, rings.WRSend, sig, l.ma.sge(0, 8)))
		require.Eventually(t, func() bool { return l.ra.m.Stats().TimeoutsHeld > uint64(fast.retry) }, 10*time.Second, 50*time.Microsecond,
			"the requester's timer comes due more than retry_cnt times")
		releaseB()
		c := l.ca.wait(1)[0]
		assert.Equal(t, uint32(rings.WCSuccess), c.Status, "%+v", c)
		s := l.ra.m.Stats()
		assert.Zero(t, s.Retransmits)
		assert.Zero(t, s.Timeouts)
	})
	t.Run("request a live peer dropped", func(t *testing.T) {
		fa, fb := twoFabrics(t, "dir")
		l := newRCLinksOn(t, fa, fb, 1, fast)[0]
		// Once the link works, a's QP points at a QP number b does not have.
		l.qb.recv(1, l.mb.sge(0, 64))
		l.qa.send(sendWR(1, rings.WRSend, sig, l.ma.sge(0, 8)))
		require.Equal(t, uint32(rings.WCSuccess), l.ca.wait(1)[0].Status)
		pd := l.ra.pd()
		mr := l.ra.mr(pd, 4096, allAccess)
		q := l.ra.qp(pd, firmware.QPTypeRC, l.ca, l.ca, 16, qpOpts{})
		q.connect(0xabcdef, l.rb.gid, fast)
		q.send(sendWR(2, rings.WRSend, sig, mr.sge(0, 8)))
		c := l.ca.wait(1)[0]
		assert.Equal(t, uint32(rings.WCRetryExcErr), c.Status, "%+v", c)
		assert.Equal(t, uint64(fast.retry), l.ra.m.Stats().Retransmits)
	})
}

// Many QPs whose ACK timeout (8 µs) is far shorter than a pass of the
// model over its inbox: on a fabric that loses nothing every send
// completes, and nothing is sent twice.
func TestALossFreeFabricRetransmitsNothingWhenTheModelIsSlowerThanTheTimeout(t *testing.T) {
	const qps, sends = 64, 8
	fast := defaultRC()
	fast.timeout = 1 // 8.192 µs, retry_cnt 7
	fab := pvsim.NewFabric()
	ls := newRCLinks(t, fab, qps, fast)
	for i := range ls {
		for j := range sends {
			ls[i].qb.recv(uint64(j), ls[i].mb.sge(64*i, 64))
		}
	}
	ws := make([]wr, sends)
	for j := range ws {
		ws[j] = sendWR(uint64(j), rings.WRSend, sig, ls[0].ma.sge(8*j, 8))
	}
	for i := range ls {
		ls[i].qa.send(ws...)
	}
	for i := range ls {
		for _, c := range ls[i].ca.wait(sends) {
			require.Equal(t, uint32(rings.WCSuccess), c.Status, "QP %d: %+v", i, c)
		}
	}
	s := fab.Stats()
	assert.Zero(t, s.Retransmits, "%+v", s)
	assert.Zero(t, s.Timeouts)
	assert.Zero(t, s.Dropped)
	assert.Equal(t, uint64(2*qps*sends), s.Packets, "a request and its acknowledgement per send")
	t.Logf("timeouts that came due while a request or its answer was inside the model: %d", s.TimeoutsHeld)
}

// A request a device takes to its Close unread is lost: the requester
// times out, retries, and fails with RETRY_EXC_ERR, as when its peer is
// really gone.
func TestARequestUnreadWhenItsResponderClosesIsLost(t *testing.T) {
	ra := defaultRC()
	ra.timeout, ra.retry = 8, 2 // 1 ms, twice
	l := newRCLinks(t, pvsim.NewFabric(), 1, ra)[0]
	l.qb.recv(1, l.mb.sge(0, 64))
	hold(t, l.rb)
	l.qa.send(sendWR(1, rings.WRSend, sig, l.ma.sge(0, 8)))
	require.Eventually(t, func() bool { s := l.ra.m.Stats(); return s.Timeouts+s.TimeoutsHeld > 0 }, 10*time.Second, 50*time.Microsecond,
		"the requester's timer came due while the request waited")
	require.NoError(t, l.rb.m.Close())
	c := l.ca.wait(1)[0]
	assert.Equal(t, uint32(rings.WCRetryExcErr), c.Status, "%+v", c)
	s := l.ra.m.Stats()
	assert.Equal(t, uint64(ra.retry)+1, s.Timeouts, "the first try and each retry")
	assert.Equal(t, uint64(ra.retry), s.Retransmits)
	assert.Equal(t, uint64(1), l.rb.m.Stats().Dropped, "the request left in its inbox")
}

// The fabric's Stats add up every field of its devices' Stats.
func TestFabricStatsSumTheDevicesStats(t *testing.T) {
	fab := pvsim.NewFabric()
	l := newRCLinks(t, fab, 1, defaultRC())[0]
	l.qb.recv(1, l.mb.sge(0, 64))
	l.qa.send(sendWR(1, rings.WRSend, sig, l.ma.sge(0, 8)))
	l.ca.wait(1)
	a, b, sum := l.ra.m.Stats(), l.rb.m.Stats(), fab.Stats()
	va, vb, vs := reflect.ValueOf(a), reflect.ValueOf(b), reflect.ValueOf(sum)
	for i := range vs.NumField() {
		name := vs.Type().Field(i).Name
		if vs.Field(i).Kind() == reflect.Array {
			for j := range vs.Field(i).Len() {
				assert.Equal(t, va.Field(i).Index(j).Uint()+vb.Field(i).Index(j).Uint(), vs.Field(i).Index(j).Uint(), "%s[%d]", name, j)
			}
			continue
		}
		assert.Equal(t, va.Field(i).Uint()+vb.Field(i).Uint(), vs.Field(i).Uint(), name)
	}
	assert.NotZero(t, sum.Commands)
	assert.Equal(t, uint64(2), sum.Packets, "the send and its acknowledgement")
}
