package pvsim_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

// One-sided operations cross the directory's sockets as within one
// process: RDMA WRITE (with immediate), READ, compare-and-swap and
// fetch-and-add, at version 20, with the bytes checked at both ends.
func TestAFabricAcrossProcessesRunsOneSidedOperations(t *testing.T) {
	fa, fb := twoFabrics(t, "dir")
	cfg := pvsim.Config{Version: 20}
	a, b := newNode(t, cfg, fa, 1), newNode(t, cfg, fb, 2)
	qa, qb := a.qp(t, vfrdma.RC, nil), b.qp(t, vfrdma.RC, nil)
	connect(t, a, qa, b, qb)
	send := func(wr vfrdma.SendWR) vfrdma.WC {
		t.Helper()
		wr.Flags |= signaled
		_, err := qa.PostSend([]vfrdma.SendWR{wr}, 0)
		require.NoError(t, err)
		wc := poll(t, a.cq, 1)[0]
		require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
		return wc
	}
	copy(a.mr.Bytes(), "written across")
	send(vfrdma.SendWR{WRID: 1, Opcode: vfrdma.OpRDMAWrite, SGEs: []vfrdma.SGE{a.mr.SGE(0, 14)}, RemoteAddr: b.mr.Addr() + 1000, RKey: b.mr.RKey()})
	assert.Equal(t, "written across", string(b.mr.Bytes()[1000:1014]))

	_, err := qb.PostRecv([]vfrdma.RecvWR{{WRID: 50, SGEs: []vfrdma.SGE{b.mr.SGE(8192, 16)}}}, 0)
	require.NoError(t, err)
	send(vfrdma.SendWR{WRID: 2, Opcode: vfrdma.OpRDMAWriteWithImm, Imm: 0xfeedbeef, SGEs: []vfrdma.SGE{a.mr.SGE(0, 7)}, RemoteAddr: b.mr.Addr() + 2000, RKey: b.mr.RKey()})
	rc := poll(t, b.cq, 1)[0]
	require.Equal(t, vfrdma.WCSuccess, rc.Status)
	assert.Equal(t, vfrdma.WCRecvRDMAWithImm, rc.Opcode)
	assert.Equal(t, uint32(0xfeedbeef), rc.Imm)
	assert.Equal(t, "written", string(b.mr.Bytes()[2000:2007]))

	copy(b.mr.Bytes()[30000:], "read me back")
	wc := send(vfrdma.SendWR{WRID: 3, Opcode: vfrdma.OpRDMARead, SGEs: []vfrdma.SGE{a.mr.SGE(5000, 12)}, RemoteAddr: b.mr.Addr() + 30000, RKey: b.mr.RKey()})
	assert.Equal(t, vfrdma.WCRDMARead, wc.Opcode)
	assert.Equal(t, "read me back", string(a.mr.Bytes()[5000:5012]))

	binary.LittleEndian.PutUint64(b.mr.Bytes()[4096:], 41)
	send(vfrdma.SendWR{WRID: 4, Opcode: vfrdma.OpAtomicFetchAdd, SGEs: []vfrdma.SGE{a.mr.SGE(6000, 8)}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: 1})
	assert.Equal(t, uint64(41), binary.LittleEndian.Uint64(a.mr.Bytes()[6000:]), "the old value")
	assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(b.mr.Bytes()[4096:]))
	send(vfrdma.SendWR{WRID: 5, Opcode: vfrdma.OpAtomicCmpSwap, SGEs: []vfrdma.SGE{a.mr.SGE(6008, 8)}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: 42, Swap: 7})
	assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(a.mr.Bytes()[6008:]))
	assert.Equal(t, uint64(7), binary.LittleEndian.Uint64(b.mr.Bytes()[4096:]))

	// A bad rkey is the responder's remote access error, as in one process.
	_, err = qa.PostSend([]vfrdma.SendWR{{WRID: 6, Flags: signaled, Opcode: vfrdma.OpRDMAWrite, SGEs: []vfrdma.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() ^ 0x5a5a}}, 0)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.WCRemAccessErr, poll(t, a.cq, 1)[0].Status)
}

// A connection that does not open with the fabric's magic, or whose frame
// breaks the format, is refused and closed; the fabric carries traffic
// as before.
func TestAStrangerOnTheFabricDirectoryIsRefusedAtItsFirstBytes(t *testing.T) {
	fa, fb := twoFabrics(t, "dir")
	socks, err := filepath.Glob(filepath.Join(fa.Dir(), "node", "*.sock"))
	require.NoError(t, err)
	require.Len(t, socks, 2)
	refused := func() int64 { return fa.NetStats().Refused + fb.NetStats().Refused }

	c, err := net.Dial("unix", socks[0])
	require.NoError(t, err)
	_, err = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return refused() == 1 }, time.Minute, time.Millisecond)
	c.Close()

	// The magic, then a frame of an unknown kind.
	c, err = net.Dial("unix", socks[1])
	require.NoError(t, err)
	frame := make([]byte, 4+112)
	binary.LittleEndian.PutUint32(frame, 112)
	frame[4] = 99
	_, err = c.Write(append([]byte{'p', 'v', 's', 'i', 'm', 'F', 'B', 1}, frame...))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return refused() == 2 }, time.Minute, time.Millisecond)
	c.Close()

	a, b := newNode(t, pvsim.Config{Version: 20}, fa, 1), newNode(t, pvsim.Config{Version: 20}, fb, 2)
	qa, qb := a.qp(t, vfrdma.RC, nil), b.qp(t, vfrdma.RC, nil)
	connect(t, a, qa, b, qb)
	_, err = qb.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{b.mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
	copy(a.mr.Bytes(), "after the stranger")
	_, err = qa.PostSend([]vfrdma.SendWR{{WRID: 2, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(0, 18)}}}, 0)
	require.NoError(t, err)
	require.Equal(t, vfrdma.WCSuccess, poll(t, a.cq, 1)[0].Status)
	require.Equal(t, vfrdma.WCSuccess, poll(t, b.cq, 1)[0].Status)
	assert.Equal(t, "after the stranger", string(b.mr.Bytes()[:18]))
	assert.Equal(t, int64(2), refused())
}

// The environment variable that makes this test binary a peer process.
const fabricChildEnv = "PVSIM_FABRIC_CHILD"

// fabricChild is the peer process of TestAPeerProcessThatDiesIsAPeerGone:
// a model on the fabric of dir with an RC QP that it connects to the one
// dir/parent names, receives posted; it answers each message it receives
// with the same bytes, until it is killed.
func fabricChild(dir string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "fabric child:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fab, err := pvsim.JoinFabric(dir)
	if err != nil {
		return fail(err)
	}
	m, err := pvsim.New(pvsim.Config{Version: 20, Fabric: fab, MAC: [6]byte{2, 0, 0, 0, 0, 9}})
	if err != nil {
		return fail(err)
	}
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		return fail(err)
	}
	pd, err := d.AllocPD(ctx)
	if err != nil {
		return fail(err)
	}
	cq, err := d.CreateCQ(ctx, 64)
	if err != nil {
		return fail(err)
	}
	mr, err := pd.AllocMR(ctx, 1<<16, vfrdma.AccessLocalWrite)
	if err != nil {
		return fail(err)
	}
	qp, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true})
	if err != nil {
		return fail(err)
	}
	g := d.GID()
	if err := os.WriteFile(filepath.Join(dir, "child.tmp"), fmt.Appendf(nil, "%d %s", qp.QPN(), hex.EncodeToString(g[:])), 0o644); err != nil {
		return fail(err)
	}
	if err := os.Rename(filepath.Join(dir, "child.tmp"), filepath.Join(dir, "child")); err != nil {
		return fail(err)
	}
	var peer vfrdma.Remote
	for {
		b, err := os.ReadFile(filepath.Join(dir, "parent"))
		if err == nil {
			if peer, err = parseAddr(string(b)); err != nil {
				return fail(err)
			}
			break
		}
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
	if err := qp.Init(ctx); err != nil {
		return fail(err)
	}
	for i := range 16 {
		if _, err := qp.PostRecv([]vfrdma.RecvWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(i*1024, 1024)}}}, 0); err != nil {
			return fail(err)
		}
	}
	if err := qp.Connect(ctx, peer, 0); err != nil {
		return fail(err)
	}
	wcs := make([]vfrdma.WC, 16)
	for {
		if err := cq.Wait(ctx); err != nil {
			return fail(err)
		}
		n, err := cq.Poll(wcs)
		if err != nil {
			return fail(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != vfrdma.WCSuccess {
				return fail(fmt.Errorf("completion %+v", wc))
			}
			if wc.Opcode != vfrdma.WCRecv {
				continue
			}
			slot := int(wc.WRID)
			if _, err := qp.PostSend([]vfrdma.SendWR{{WRID: 100, SGEs: []vfrdma.SGE{mr.SGE(slot*1024, int(wc.ByteLen))}}}, 0); err != nil {
				return fail(err)
			}
			if _, err := qp.PostRecv([]vfrdma.RecvWR{{WRID: uint64(slot), SGEs: []vfrdma.SGE{mr.SGE(slot*1024, 1024)}}}, 0); err != nil {
				return fail(err)
			}
		}
	}
}

func parseAddr(s string) (vfrdma.Remote, error) {
	var r vfrdma.Remote
	var gid string
	if _, err := fmt.Sscanf(strings.TrimSpace(s), "%d %s", &r.QPN, &gid); err != nil {
		return r, err
	}
	b, err := hex.DecodeString(gid)
	if err != nil || len(b) != 16 {
		return r, fmt.Errorf("bad GID %q", gid)
	}
	copy(r.GID[:], b)
	return r, nil
}

// Two processes on one fabric directory: messages go to the peer process
// and come back; once the peer is killed, the next send meets its retry
// limit (RETRY_EXC_ERR) as on a cut link, and nothing waits forever.
func TestAPeerProcessThatDiesIsAPeerGone(t *testing.T) {
	dir := fabricDir(t)
	fab, err := pvsim.JoinFabric(dir)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, fab.Close()) })
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), fabricChildEnv+"="+dir)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	t.Cleanup(func() {
		_ = child.Process.Kill()
		<-exited
	})

	a := newNode(t, pvsim.Config{Version: 20}, fab, 1)
	qa := a.qp(t, vfrdma.RC, nil)
	var peer vfrdma.Remote
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "child"))
		if err != nil {
			return false
		}
		peer, err = parseAddr(string(b))
		require.NoError(t, err)
		return true
	}, time.Minute, time.Millisecond, "the peer process never came up")
	g := a.d.GID()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "parent"), fmt.Appendf(nil, "%d %s", qa.QPN(), hex.EncodeToString(g[:])), 0o644))
	ctx := ctxT(t)
	require.NoError(t, qa.Init(ctx))
	for i := range 4 {
		_, err := qa.PostRecv([]vfrdma.RecvWR{{WRID: uint64(1000 + i), SGEs: []vfrdma.SGE{a.mr.SGE(32768+i*1024, 1024)}}}, 0)
		require.NoError(t, err)
	}
	require.NoError(t, qa.Connect(ctx, peer, 0))

	// RNR retries (rnr_retry 7: for ever) cover the peer's receives not
	// posted yet.
	for i := range 4 {
		msg := fmt.Sprintf("round trip %d", i)
		copy(a.mr.Bytes()[i*1024:], msg)
		_, err := qa.PostSend([]vfrdma.SendWR{{WRID: uint64(i), Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(i*1024, len(msg))}}}, 0)
		require.NoError(t, err)
		for _, wc := range poll(t, a.cq, 2) {
			require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
			if wc.Opcode == vfrdma.WCRecv {
				assert.Equal(t, msg, string(a.mr.Bytes()[32768+i*1024:32768+i*1024+len(msg)]), "the peer process echoed it")
			}
		}
	}
	assert.NotZero(t, fab.NetStats().FramesIn)

	require.NoError(t, child.Process.Kill())
	<-exited
	exited <- nil // for the cleanup
	_, err = qa.PostSend([]vfrdma.SendWR{{WRID: 9, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	wcs := make([]vfrdma.WC, 4)
	var got []vfrdma.WC
	wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for len(got) == 0 {
		require.NoError(t, a.cq.Wait(wctx), "the send to a dead process never completed")
		n, err := a.cq.Poll(wcs)
		require.NoError(t, err)
		got = append(got, wcs[:n]...)
	}
	assert.Equal(t, uint64(9), got[0].WRID)
	assert.Equal(t, vfrdma.WCStatus(rings.WCRetryExcErr), got[0].Status)
	assert.Zero(t, fab.NetStats().Refused, "a peer that died is no stranger")
}

// A request to a GID no device of the peer process has any more (its
// model closed, the process and its fabric alive) is dropped there and
// the requester is told: its retries end in RETRY_EXC_ERR, nothing waits
// for ever.
func TestARequestToAModelThatClosedInALiveProcessIsLost(t *testing.T) {
	fa, fb := twoFabrics(t, "dir")
	cfg := pvsim.Config{Version: 20}
	a, b := newNode(t, cfg, fa, 1), newNode(t, cfg, fb, 2)
	qa, qb := a.qp(t, vfrdma.RC, nil), b.qp(t, vfrdma.RC, nil)
	connect(t, a, qa, b, qb)
	_, err := qb.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{b.mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
	_, err = qa.PostSend([]vfrdma.SendWR{{WRID: 2, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	require.Equal(t, vfrdma.WCSuccess, poll(t, a.cq, 1)[0].Status)
	require.NoError(t, b.d.Close())
	require.NoError(t, b.m.Close())
	_, err = qa.PostSend([]vfrdma.SendWR{{WRID: 3, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	wcs := make([]vfrdma.WC, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got []vfrdma.WC
	for len(got) == 0 {
		require.NoError(t, a.cq.Wait(ctx), "the send to a closed model never completed")
		n, err := a.cq.Poll(wcs)
		require.NoError(t, err)
		got = append(got, wcs[:n]...)
	}
	assert.Equal(t, vfrdma.WCStatus(rings.WCRetryExcErr), got[0].Status)
	assert.NotZero(t, fb.NetStats().Undelivered)
}
