package vfrdma

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/event"
)

// A new CQ is in CQPolled mode: Poll takes its completions, and a
// counter's progress (CQSource.Progress) is refused with an error
// wrapping ErrBusy that names the mode and the call that changes it. In
// CQCounted mode it is the other way round. SetMode switches both ways;
// a mode other than the two is refused with ErrInvalid and changes
// nothing.
func TestCQModeRefusesTheOtherModesCallsWithErrBusy(t *testing.T) {
	l := newLCDevice(t)
	cq, prod := l.addCQ(t, 5, 64)
	qp, sq := l.addQP(t, 0x40, cq, 16)
	wcs := make([]WC, 4)
	sendAndComplete := func(id uint64) {
		t.Helper()
		_, err := qp.PostSend(l.send(id), 0)
		require.NoError(t, err)
		require.Equal(t, 1, complete(t, qp, sq, cq, prod))
	}

	assert.Equal(t, CQPolled, cq.Mode(), "a new CQ")
	_, err := cq.Source().Progress()
	require.ErrorIs(t, err, ErrBusy, "Progress on a CQPolled CQ")
	assert.ErrorContains(t, err, "CQ 5 is in CQPolled mode")
	assert.ErrorContains(t, err, "CQ.SetMode(CQCounted)")
	sendAndComplete(1)
	n, err := cq.Poll(wcs)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "Poll on a CQPolled CQ")

	require.NoError(t, cq.SetMode(CQCounted))
	assert.Equal(t, CQCounted, cq.Mode())
	sendAndComplete(2)
	_, err = cq.Poll(wcs)
	require.ErrorIs(t, err, ErrBusy, "Poll on a CQCounted CQ")
	assert.ErrorContains(t, err, "CQ 5 is in CQCounted mode")
	assert.ErrorContains(t, err, "CQ.SetMode(CQPolled)")
	n, err = cq.Source().Progress()
	require.NoError(t, err)
	assert.Equal(t, 1, n, "Progress on a CQCounted CQ took the completion Poll was refused")

	require.NoError(t, cq.SetMode(CQPolled))
	sendAndComplete(3)
	n, err = cq.Poll(wcs)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "Poll once the CQ is back in CQPolled mode")

	assert.ErrorIs(t, cq.SetMode(CQCounted+1), ErrInvalid)
	assert.Equal(t, CQPolled, cq.Mode(), "a refused SetMode changes nothing")
	assert.Equal(t, "CQMode(2)", (CQCounted + 1).String())
}

// A counter drives a CQ only in CQCounted mode: on a CQPolled CQ its
// reads return the CQ's refusal.
func TestACounterDrivingACQPolledCQReadsItsRefusal(t *testing.T) {
	l := newLCDevice(t)
	cq, _ := l.addCQ(t, 5, 64)
	c := event.NewCounter()
	require.NoError(t, c.Drive(cq.Source()))
	t.Cleanup(func() { _ = c.Undrive(cq.Source()) })
	_, err := c.Read()
	assert.ErrorIs(t, err, ErrBusy)
	require.NoError(t, cq.SetMode(CQCounted))
	_, err = c.Read()
	assert.NoError(t, err)
}

// Source returns one value per CQ, the same every time, so that a set
// finds the member it was given; it is the CQ's.
func TestCQSourceIsOneValuePerCQ(t *testing.T) {
	l := newLCDevice(t)
	a, _ := l.addCQ(t, 5, 64)
	b, _ := l.addCQ(t, 6, 64)
	assert.Same(t, a.Source(), a.Source())
	assert.NotSame(t, a.Source(), b.Source())
	assert.Same(t, a, a.Source().CQ())
	assert.Equal(t, a.Spin(), a.Source().Spin(), "a wait set spins as the CQ's Wait does")
	var none *CQ
	assert.Nil(t, none.Source(), "a nil CQ's source")
}
