package bridge

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// openQEMUModel opens the model in QEMU's mode, the device that completes
// every send whatever its flags.
func openQEMUModel(t *testing.T) (*Context, *PD) {
	t.Helper()
	env := Env{Model: "qemu"}
	devs, err := Devices(env)
	require.NoError(t, err)
	c, err := Open(devs[0], env)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.True(t, c.Dev.Quirks().Emulated)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	return c, pd
}

// selectivePair makes two connected RC QPs of send depth depth signaling
// selectively (sq_sig_all 0), a's sends on scq, b's receives on rcq, and
// a registered buffer.
func selectivePair(t *testing.T, c *Context, pd *PD, depth int) (scq, rcq *CQ, a, b *QP, sge vfrdma.SGE) {
	t.Helper()
	var err error
	scq, err = c.CreateCQ(4*depth, nil)
	require.NoError(t, err)
	rcq, err = c.CreateCQ(4*depth, nil)
	require.NoError(t, err)
	mk := func() *QP {
		qp, err := pd.CreateQP(QPInit{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq,
			Cap: QPCap{MaxSendWR: depth, MaxRecvWR: 4 * depth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = qp.Destroy() })
		return qp
	}
	a, b = mk(), mk()
	gid := c.Dev.GID()
	for _, p := range [][2]*QP{{a, b}, {b, a}} {
		require.NoError(t, p[0].Modify(&QPAttr{State: StateInit, Port: 1}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags))
		full := MaskState | MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRDAtomic | MaskMinRNRTimer
		require.NoError(t, p[0].Modify(&QPAttr{State: StateRTR, DestQPN: p[1].QPN(), AH: AHAttr{IsGlobal: true, DGID: gid, PortNum: 1}}, full))
		require.NoError(t, p[0].Modify(&QPAttr{State: StateRTS}, MaskState|MaskSQPSN|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskMaxQPRDAtomic))
	}
	buf := make([]byte, 4096)
	t.Cleanup(func() { runtime.KeepAlive(buf) }) // the device writes it until the QPs are gone
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	mr, err := pd.RegMR(unsafe.Pointer(&buf[0]), len(buf), addr, 1)
	require.NoError(t, err)
	return scq, rcq, a, b, vfrdma.SGE{Addr: addr, Length: 8, LKey: mr.LKey()}
}

// postSends posts n sends of wr_ids from first on, signaling those for
// which sig says so, in one call.
func postSends(t *testing.T, qp *QP, sge vfrdma.SGE, first uint64, n int, sig func(i int) bool) (int, error) {
	t.Helper()
	reqs := qp.BeginSend()
	for i := range n {
		r := &reqs[i]
		r.WRID, r.Opcode, r.NumSGE, r.SGEs[0], r.Flags = first+uint64(i), WRSend, 1, sge, 0
		if sig(i) {
			r.Flags = SendSignaled
		}
	}
	return qp.PostSend(n)
}

// pollUntil polls cq until want completions came, or a minute (a hang
// guard) passed, and returns them.
func pollUntil(t *testing.T, cq *CQ, want int) []WC {
	t.Helper()
	var got []WC
	require.Eventually(t, func() bool {
		w, err := cq.Poll(64)
		got = append(got, w...)
		cq.EndPoll()
		require.NoError(t, err)
		return len(got) >= want
	}, time.Minute, time.Millisecond, "%d completions of %d", len(got), want)
	return got
}

// The verbs' rule on a QP with sq_sig_all 0: a send posted without
// IBV_SEND_SIGNALED that succeeds makes no completion. QEMU's device
// completes every send; the drop-in hides the unsignaled ones' (perftest
// signals one send in cq_mod and counts cq_mod per completion).
func TestOnQEMUAnUnsignaledSendThatSucceedsMakesNoCompletion(t *testing.T) {
	c, pd := openQEMUModel(t)
	const depth = 8
	scq, rcq, a, b, sge := selectivePair(t, c, pd, depth)
	require.NotNil(t, a.sig, "a selective QP on a device that completes every send")
	const rounds = 10
	var sends []WC
	for round := range rounds {
		reqs := b.BeginRecv()
		for i := range depth {
			reqs[i].WRID, reqs[i].NumSGE, reqs[i].SGEs[0] = uint64(i), 1, sge
		}
		n, err := b.PostRecv(depth)
		require.NoError(t, err)
		require.Equal(t, depth, n)
		// The last of each four signaled (perftest's cq_mod), the queue
		// full: depth sends in one call.
		n, err = postSends(t, a, sge, uint64(round*depth), depth, func(i int) bool { return i%4 == 3 })
		require.NoError(t, err)
		require.Equal(t, depth, n)
		pollUntil(t, rcq, depth)
		sends = append(sends, pollUntil(t, scq, depth/4)...)
	}
	var ids []uint64
	for _, w := range sends {
		assert.Equal(t, uint32(vfrdma.WCSuccess), w.Status)
		ids = append(ids, w.WRID)
	}
	var want []uint64
	for i := range rounds * depth {
		if i%4 == 3 {
			want = append(want, uint64(i))
		}
	}
	assert.Equal(t, want, ids, "the signaled sends' completions, and no other")
	assert.Equal(t, uint64(rounds*depth*3/4), a.sig.hidden.Load())
	w, err := scq.Poll(64)
	scq.EndPoll()
	require.NoError(t, err)
	assert.Empty(t, w, "nothing more")
	out, _ := a.qp.Outstanding()
	assert.Zero(t, out, "every send retired")
}

// An unsignaled send that fails still makes its completion (the verbs'
// rule): flushed by the QP's move to ERR, each one is seen.
func TestOnQEMUAnUnsignaledSendThatFailsMakesItsCompletion(t *testing.T) {
	c, pd := openQEMUModel(t)
	const depth = 8
	scq, _, a, _, sge := selectivePair(t, c, pd, depth)
	// No receive at the peer: the sends wait (RNR) until the move to ERR.
	n, err := postSends(t, a, sge, 0, depth, func(int) bool { return false })
	require.NoError(t, err)
	require.Equal(t, depth, n)
	require.NoError(t, a.Modify(&QPAttr{State: StateErr}, MaskState))
	got := pollUntil(t, scq, depth)
	require.Len(t, got, depth)
	for i, w := range got {
		assert.Equal(t, uint64(i), w.WRID)
		assert.NotEqual(t, uint32(vfrdma.WCSuccess), w.Status, "wr_id %d", w.WRID)
	}
	assert.Zero(t, a.sig.hidden.Load())
}

// A post one past the send queue's room is refused and leaves no record:
// the next completions still hide exactly the unsignaled sends, even one
// with the refused request's wr_id.
func TestOnQEMUAPostPastTheSendQueuesRoomKeepsTheSignaledRecord(t *testing.T) {
	c, pd := openQEMUModel(t)
	const depth = 8
	scq, rcq, a, b, sge := selectivePair(t, c, pd, depth)
	// depth sends wait for receives; one more (signaled) is refused.
	n, err := postSends(t, a, sge, 0, depth, func(i int) bool { return i == depth-1 })
	require.NoError(t, err)
	require.Equal(t, depth, n)
	n, err = postSends(t, a, sge, 100, 1, func(int) bool { return true })
	require.Error(t, err, "one past the queue's room")
	assert.Zero(t, n)
	reqs := b.BeginRecv()
	for i := range 2 * depth {
		reqs[i].WRID, reqs[i].NumSGE, reqs[i].SGEs[0] = uint64(i), 1, sge
	}
	_, err = b.PostRecv(2 * depth)
	require.NoError(t, err)
	pollUntil(t, rcq, depth)
	got := pollUntil(t, scq, 1)
	require.Len(t, got, 1)
	assert.Equal(t, uint64(depth-1), got[0].WRID, "the one signaled send")
	// Then wr_id 100 again, unsignaled this time, and 101 signaled.
	n, err = postSends(t, a, sge, 100, 2, func(i int) bool { return i == 1 })
	require.NoError(t, err)
	require.Equal(t, 2, n)
	pollUntil(t, rcq, 2)
	got = pollUntil(t, scq, 1)
	require.Len(t, got, 1)
	assert.Equal(t, uint64(101), got[0].WRID, "the signaled send only")
	assert.Equal(t, uint64(depth), a.sig.hidden.Load())
}

// A device that honours signaling (VMware's, v20) keeps no record: the
// device itself makes no completion for an unsignaled send.
func TestADeviceThatHonoursSignalingKeepsNoSignaledRecord(t *testing.T) {
	c, pd := openModel(t)
	_, _, a, _, _ := selectivePair(t, c, pd, 8)
	assert.Nil(t, a.sig)
}

// The record's work on the hot paths (a push at post, a look-up and pop
// at poll) allocates nothing.
func TestTheSignaledRecordAllocatesNothing(t *testing.T) {
	c, pd := openQEMUModel(t)
	scq, _, a, _, _ := selectivePair(t, c, pd, 8)
	wcs := []vfrdma.WC{{WRID: 7, QPN: a.QPN(), Opcode: vfrdma.WCSend}}
	allocs := testing.AllocsPerRun(200, func() {
		a.sig.push(0, 7, false)
		a.sig.publish(1)
		wcs[0].WRID = 7
		if scq.filterSig(wcs) != 0 {
			panic("an unsignaled send's success shown")
		}
	})
	assert.Zero(t, allocs)
}

// VFRDMA_POLL_PACE takes a Go duration or "every"; anything else, or 0,
// is refused at open with the variable named.
func TestThePollPaceVariableTakesADurationOrEvery(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 0, "every": -1, "50us": 50 * time.Microsecond, "-1ns": -1} {
		got, err := ParsePollPace(v)
		require.NoError(t, err, "%q", v)
		assert.Equal(t, want, got, "%q", v)
	}
	for _, v := range []string{"0", "fast", "50"} {
		_, err := ParsePollPace(v)
		require.Error(t, err, "%q", v)
		assert.ErrorIs(t, err, errInvalid)
		assert.Contains(t, err.Error(), EnvPollPace)
	}
	_, err := Open(DeviceInfo{Model: "qemu"}, Env{Model: "qemu", PollPace: "fast"})
	assert.ErrorIs(t, err, errInvalid, "Open refuses it")
}
