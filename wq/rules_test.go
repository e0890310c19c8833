package wq_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// Tests that pin down rules no other test guards: each one fails when the
// fault its comment names ("Fault caught: ...") is planted in the
// package's code.

// failingRegister is a doorbell register whose stores fail while err is
// set (a revoked BAR, say); it counts the stores that succeeded.
type failingRegister struct {
	err    error
	stores int
}

func (r *failingRegister) Store32(off int, v uint32) error {
	if r.err != nil {
		return r.err
	}
	r.stores++
	return nil
}

// Rule: a doorbell store that fails at the end of a post is the post's
// error, never a success: End returns a *PostError for the doorbell itself
// (Index -1) wrapping the store's error; a refused request's Fail joins it
// to the refusal's cause; Ring returns it. The requests stay pending, and
// the next doorbell that works hands them all over. (Faults caught: End
// dropping db.Post's error; Fail dropping db.Fail's.)
func TestAFailedDoorbellStoreAtTheEndOfAPostIsAnError(t *testing.T) {
	errStore := errors.New("doorbell store failed")
	reg := &failingRegister{err: errStore}
	var w wq.Queue
	stride := rings.RecvStride(1)
	const depth = 8
	require.NoError(t, w.Init("QP 1", reg, make([]byte, 8), make([]byte, depth*stride), stride, depth, 1, doorbell.OffsetQP, doorbell.QPRecv|1))

	w.PutRecv(1, nil)
	require.NoError(t, w.End(true), "a deferred post rings nothing")
	w.PutRecv(2, nil)
	err := w.End(false)
	require.Error(t, err, "a post whose doorbell failed reported success")
	var pe *wq.PostError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, -1, pe.Index, "the doorbell itself failed")
	assert.Equal(t, "QP 1", pe.Queue)
	assert.ErrorIs(t, err, errStore)

	w.PutRecv(3, nil)
	err = w.Fail(1, 4, wq.ErrQueueFull)
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 1, pe.Index)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "the refusal's cause")
	assert.ErrorIs(t, err, errStore, "a refusal hid the failed doorbell")

	assert.ErrorIs(t, w.Ring(), errStore, "Ring")
	assert.Zero(t, reg.stores)
	assert.Zero(t, w.Doorbell().Stats().Doorbells)
	assert.Equal(t, 3, w.Doorbell().Pending(), "the requests are no longer pending")

	reg.err = nil
	require.NoError(t, w.Ring(), "the register works again")
	assert.Equal(t, 1, reg.stores)
	st := w.Doorbell().Stats()
	assert.EqualValues(t, 1, st.Doorbells)
	assert.EqualValues(t, 3, st.WQEs, "one doorbell hands over everything pending")
}

// postRecvs is a receive post call as the root package and srq make one:
// each request is checked, then claimed and written; a refusal ends the
// call with Fail.
func postRecvs(w *wq.Queue, c *wq.SGEChecker, wrs []wq.RecvWR) (int, error) {
	for i := range wrs {
		if _, err := c.Check(wrs[i].SGEs); err != nil {
			return i, w.Fail(i, wrs[i].WRID, err)
		}
		w.PutRecv(wrs[i].WRID, wrs[i].SGEs)
	}
	return len(wrs), w.End(false)
}

// Rule: the one-SGE fast path (one SGE naming the MR the call resolved
// last) checks the SGE's key and bounds as the full check does: an SGE out
// of the MR (a bad address or a length past its end) is ErrInvalid, a key
// other than the remembered one is resolved afresh (ErrPrivileges for an
// unknown key, ErrProtection for another PD's), and the refused request
// writes nothing to the ring. (Faults caught: the fast path without its
// bounds check; without its key comparison.)
func TestTheOneSGEFastPathRefusesABadSGEAndWritesNothing(t *testing.T) {
	good := wq.SGE{Addr: 0x1000, Length: 0x100, LKey: keyRW} // in keyRW's MR [0x1000, 0x11000)
	for _, tc := range []struct {
		name string
		bad  wq.SGE
		want error
	}{
		{"a length past the end of the MR", wq.SGE{Addr: 0x10f00, Length: 0x101, LKey: keyRW}, wq.ErrInvalid},
		{"an address past the end of the MR", wq.SGE{Addr: 0x11001, Length: 0, LKey: keyRW}, wq.ErrInvalid},
		{"an address before the MR", wq.SGE{Addr: 0xfff, Length: 1, LKey: keyRW}, wq.ErrInvalid},
		{"a huge length", wq.SGE{Addr: 0x2000, Length: 1 << 31, LKey: keyRW}, wq.ErrInvalid},
		{"an unknown key inside the remembered MR", wq.SGE{Addr: 0x1000, Length: 1, LKey: 7}, wq.ErrPrivileges},
		{"another PD's key inside the remembered MR", wq.SGE{Addr: 0x1000, Length: 1, LKey: keyOther}, wq.ErrProtection},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, cons := newQueue(t, 8)
			data := w.Data()
			for i := range data {
				data[i] = 0xEE
			}
			c := wq.NewSGEChecker(checkKeys(), 1, w.MaxSGE(), true)
			wrs := []wq.RecvWR{
				{WRID: 1, SGEs: []wq.SGE{good}}, // resolves keyRW
				{WRID: 2, SGEs: []wq.SGE{good}}, // the fast path
				{WRID: 3, SGEs: []wq.SGE{tc.bad}},
				{WRID: 4, SGEs: []wq.SGE{good}},
			}
			n, err := postRecvs(w, &c, wrs)
			assert.Equal(t, 2, n, "requests posted")
			require.ErrorIs(t, err, tc.want)
			for _, other := range sentinels {
				if other != tc.want {
					assert.NotErrorIs(t, err, other)
				}
			}
			var pe *wq.PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, 2, pe.Index)
			assert.EqualValues(t, 3, pe.WRID)

			ready, rerr := cons.Ready()
			require.NoError(t, rerr)
			assert.Equal(t, 2, ready, "the device sees the requests before the refused one, and only them")
			assert.Equal(t, 2, w.Outstanding())
			for i := 0; i < ready; i++ {
				sges := make([]wq.SGE, 1)
				id, k, derr := rings.DecodeRecvWQE(w.Slot(cons.Slot(i)), sges)
				require.NoError(t, derr)
				assert.EqualValues(t, i+1, id)
				assert.Equal(t, []wq.SGE{good}, sges[:k])
			}
			for _, b := range w.Slot(cons.Slot(ready)) {
				if !assert.EqualValues(t, 0xEE, b, "the refused request wrote its slot") {
					break
				}
			}
		})
	}
	t.Run("the fast path accepts the whole MR", func(t *testing.T) {
		c := wq.NewSGEChecker(checkKeys(), 1, 1, true)
		_, err := c.Check([]wq.SGE{good})
		require.NoError(t, err)
		n, err := c.Check([]wq.SGE{{Addr: 0x1000, Length: 0x10000, LKey: keyRW}})
		require.NoError(t, err)
		assert.Equal(t, 0x10000, n)
		n, err = c.Check([]wq.SGE{{Addr: 0x11000, Length: 0, LKey: keyRW}})
		require.NoError(t, err, "an empty SGE at the end")
		assert.Zero(t, n)
	})
}

// The signaled requests a completion out of order moves up stay signaled:
// Reap, which frees consumed unsignaled slots with no completion, must not
// free them; their own completions retire them.
func TestRequestsMovedUpByACompletionOutOfOrderStaySignaled(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, true, s(1), u(2), s(3), u(4), s(5))
	require.True(t, w.Complete(5))
	n, _ := w.Reap()
	assert.Zero(t, n, "1 and 3 are signaled: only their completions retire them")
	assert.Equal(t, 2, outstanding(w))
	require.True(t, w.Complete(1))
	require.True(t, w.Complete(3))
	assert.Zero(t, outstanding(w))
}

// The fast path's remembered key starts as nothing: an SGE whose key is 0
// (the zero value) before any key was resolved is looked up like any
// other, and refused when no MR has it, not taken for a remembered MR.
func TestAKeyOfZeroIsNotTakenForTheRememberedKey(t *testing.T) {
	c := wq.NewSGEChecker(checkKeys(), 1, 1, true)
	var err error
	require.NotPanics(t, func() { _, err = c.Check([]wq.SGE{{Addr: 0x1000, Length: 1, LKey: 0}}) })
	assert.ErrorIs(t, err, wq.ErrPrivileges)
}

// On a queue that is not selective (a receive queue, or every send
// signaled), an error completion retires its request like any other.
func TestAnErrorCompletionOnAQueueNotSelectiveRetiresItsRequest(t *testing.T) {
	w, cons := newQueue(t, 8)
	c := wq.NewSGEChecker(checkKeys(), 1, w.MaxSGE(), true)
	n, err := postRecvs(w, &c, []wq.RecvWR{{WRID: 1}, {WRID: 2}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	ready, err := cons.Ready()
	require.NoError(t, err)
	cons.Consume(ready)
	var ok bool
	require.NotPanics(t, func() { ok = w.CompleteErr(1) })
	assert.True(t, ok)
	w.PublishHead()
	assert.Equal(t, 1, w.Outstanding())
}
