package vfrdma_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The driver on the device model (package pvsim): the paths a real VMware
// device takes at every interface version, and QEMU 7.2's, on the host.

var models = []struct {
	name string
	cfg  pvsim.Config
}{
	{"qemu", pvsim.Config{QEMU: true}},
	{"v17", pvsim.Config{Version: 17}},
	{"v18", pvsim.Config{Version: 18}},
	{"v18-rocev2", pvsim.Config{Version: 18, RoCEv2: true}},
	{"v19", pvsim.Config{Version: 19}},
	{"v20", pvsim.Config{Version: 20}},
}

func vmware(version uint32) pvsim.Config { return pvsim.Config{Version: version} }

// openModel opens the driver on a new model; the test closes both.
func openModel(t *testing.T, cfg pvsim.Config, opts *vfrdma.Options) (*vfrdma.Device, *pvsim.Device) {
	t.Helper()
	m, err := pvsim.New(cfg)
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, opts)
	if err != nil {
		m.Close()
		require.NoError(t, err, "OpenFunction")
	}
	t.Cleanup(func() { d.Close() })
	return d, m
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitWCs waits for n completions on cq and returns them.
func waitWCs(t *testing.T, ctx context.Context, cq *vfrdma.CQ, n int) []vfrdma.WC {
	t.Helper()
	var got []vfrdma.WC
	buf := make([]vfrdma.WC, 16)
	for len(got) < n {
		require.NoError(t, cq.Wait(ctx), "waiting for %d completions, have %d", n, len(got))
		k, err := cq.Poll(buf)
		require.NoError(t, err)
		got = append(got, buf[:k]...)
	}
	return got
}

type rcPair struct {
	pd   *vfrdma.PD
	cq   *vfrdma.CQ
	a, b *vfrdma.QP
	mr   *vfrdma.MR
}

func newRCPair(t *testing.T, ctx context.Context, d *vfrdma.Device, signalAll bool, access vfrdma.Access) *rcPair {
	t.Helper()
	p := &rcPair{}
	var err error
	p.pd, err = d.AllocPD(ctx)
	require.NoError(t, err)
	p.cq, err = d.CreateCQ(ctx, 256)
	require.NoError(t, err)
	for _, q := range []**vfrdma.QP{&p.a, &p.b} {
		*q, err = p.pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: p.cq, RecvCQ: p.cq, SendDepth: 32, RecvDepth: 32, SignalAll: signalAll})
		require.NoError(t, err)
	}
	p.mr, err = p.pd.AllocMR(ctx, 1<<16, access)
	require.NoError(t, err)
	require.NoError(t, p.a.Connect(ctx, vfrdma.Remote{QPN: p.b.QPN(), GID: d.GID()}, 0))
	require.NoError(t, p.b.Connect(ctx, vfrdma.Remote{QPN: p.a.QPN(), GID: d.GID()}, 0))
	return p
}

// Open, the data path and Close at every version: RC sends (a deferred
// chain among them) and a UD datagram arrive with their bytes, WC.QPN is
// the QP number (at v20 the device's handles are other numbers), and
// Close leaves nothing on the device.
func TestModelOpenDataPathClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tc := range models {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, m := openModel(t, tc.cfg, nil)
			assert.Equal(t, m.Version(), d.Version())
			assert.Equal(t, tc.cfg.QEMU, d.Quirks().Emulated)
			assert.Equal(t, tc.cfg.RoCEv2, d.RoCEv2())
			assert.Equal(t, m.DefaultGID(), [16]byte(d.GID()))

			p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
			if tc.cfg.Version == 20 {
				info, ok := m.QPByNumber(p.a.QPN())
				require.True(t, ok)
				assert.NotEqual(t, info.Handle, info.QPN, "v20: the handle is not the QP number")
			}
			buf := p.mr.Bytes()
			for i := range 3 {
				copy(buf[i*64:], bytes.Repeat([]byte{byte('a' + i)}, 64))
			}
			var recvs []vfrdma.RecvWR
			for i := range 3 {
				recvs = append(recvs, vfrdma.RecvWR{WRID: uint64(100 + i), SGEs: []vfrdma.SGE{p.mr.SGE(4096+i*64, 64)}})
			}
			_, err := p.b.PostRecv(recvs, 0)
			require.NoError(t, err)
			_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, vfrdma.FlagDefer)
			require.NoError(t, err)
			_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{p.mr.SGE(64, 64)}}, {WRID: 3, SGEs: []vfrdma.SGE{p.mr.SGE(128, 64)}}}, 0)
			require.NoError(t, err)
			wcs := waitWCs(t, ctx, p.cq, 6)
			for _, wc := range wcs {
				assert.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
				switch wc.Opcode {
				case vfrdma.WCRecv:
					assert.Equal(t, p.b.QPN(), wc.QPN)
					assert.Equal(t, p.a.QPN(), wc.SrcQP)
					assert.EqualValues(t, 64, wc.ByteLen)
				case vfrdma.WCSend:
					assert.Equal(t, p.a.QPN(), wc.QPN)
				default:
					assert.Fail(t, "unexpected opcode", "%+v", wc)
				}
			}
			assert.Equal(t, buf[0:192], buf[4096:4096+192], "the three messages, in order")

			// UD: the receive holds the GRH room, then the datagram.
			pd, cq := p.pd, p.cq
			ud := make([]*vfrdma.QP, 2)
			for i := range ud {
				ud[i], err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: cq, RecvCQ: cq, QKey: 0x11111111, SignalAll: true})
				require.NoError(t, err)
				require.NoError(t, ud[i].Connect(ctx, vfrdma.Remote{}, 0))
			}
			ah, err := pd.CreateAH(vfrdma.AHAttr{DGID: d.GID()})
			require.NoError(t, err)
			copy(buf[8192:], "datagram")
			_, err = ud[1].PostRecv([]vfrdma.RecvWR{{WRID: 7, SGEs: []vfrdma.SGE{p.mr.SGE(12288, 1024)}}}, 0)
			require.NoError(t, err)
			_, err = ud[0].PostSend([]vfrdma.SendWR{{WRID: 8, SGEs: []vfrdma.SGE{p.mr.SGE(8192, 8)}, AH: ah, RemoteQPN: ud[1].QPN(), RemoteQKey: 0x11111111}}, 0)
			require.NoError(t, err)
			wcs = waitWCs(t, ctx, cq, 2)
			for _, wc := range wcs {
				require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
				if wc.Opcode == vfrdma.WCRecv {
					assert.EqualValues(t, vfrdma.UDHeaderRoom+8, wc.ByteLen)
					assert.Equal(t, ud[0].QPN(), wc.SrcQP)
				}
			}
			assert.Equal(t, "datagram", string(buf[12288+vfrdma.UDHeaderRoom:12288+vfrdma.UDHeaderRoom+8]))

			require.NoError(t, d.Close())
			assert.Equal(t, pvsim.Objects{}, m.Objects(), "Close destroys everything on the device")
		})
	}
}

// One-sided operations on a VMware device: RDMA WRITE (with immediate),
// READ, compare-and-swap and fetch-and-add, with the remote MR's rkey.
func TestModelOneSidedOperations(t *testing.T) {
	for _, v := range []uint32{17, 20} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			ctx := ctxT(t)
			d, _ := openModel(t, vmware(v), nil)
			all := vfrdma.AccessLocalWrite | vfrdma.AccessRemoteWrite | vfrdma.AccessRemoteRead | vfrdma.AccessRemoteAtomic
			p := newRCPair(t, ctx, d, true, all)
			buf := p.mr.Bytes()
			remote := p.mr.Addr() + 32768
			copy(buf[0:], "written one-sided")
			_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: 1, Opcode: vfrdma.OpRDMAWrite, SGEs: []vfrdma.SGE{p.mr.SGE(0, 17)}, RemoteAddr: remote, RKey: p.mr.RKey()}}, 0)
			require.NoError(t, err)
			wc := waitWCs(t, ctx, p.cq, 1)[0]
			require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
			assert.Equal(t, vfrdma.WCRDMAWrite, wc.Opcode)
			assert.Equal(t, "written one-sided", string(buf[32768:32768+17]))

			// READ it back elsewhere.
			_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, Opcode: vfrdma.OpRDMARead, SGEs: []vfrdma.SGE{p.mr.SGE(1024, 17)}, RemoteAddr: remote, RKey: p.mr.RKey()}}, 0)
			require.NoError(t, err)
			wc = waitWCs(t, ctx, p.cq, 1)[0]
			require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
			assert.Equal(t, vfrdma.WCRDMARead, wc.Opcode)
			assert.Equal(t, "written one-sided", string(buf[1024:1024+17]))

			// Atomics on an 8-byte word: CAS 5→9, then FAA +3.
			word := 40960
			binary.LittleEndian.PutUint64(buf[word:], 5)
			_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 3, Opcode: vfrdma.OpAtomicCmpSwap, SGEs: []vfrdma.SGE{p.mr.SGE(2048, 8)}, RemoteAddr: p.mr.Addr() + uint64(word), RKey: p.mr.RKey(), CompareAdd: 5, Swap: 9}}, 0)
			require.NoError(t, err)
			wc = waitWCs(t, ctx, p.cq, 1)[0]
			require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
			assert.Equal(t, vfrdma.WCCompSwap, wc.Opcode)
			assert.EqualValues(t, 5, binary.LittleEndian.Uint64(buf[2048:]), "the old value comes back")
			assert.EqualValues(t, 9, binary.LittleEndian.Uint64(buf[word:]))
			_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 4, Opcode: vfrdma.OpAtomicFetchAdd, SGEs: []vfrdma.SGE{p.mr.SGE(2056, 8)}, RemoteAddr: p.mr.Addr() + uint64(word), RKey: p.mr.RKey(), CompareAdd: 3}}, 0)
			require.NoError(t, err)
			wc = waitWCs(t, ctx, p.cq, 1)[0]
			require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
			assert.Equal(t, vfrdma.WCFetchAdd, wc.Opcode)
			assert.EqualValues(t, 9, binary.LittleEndian.Uint64(buf[2056:]))
			assert.EqualValues(t, 12, binary.LittleEndian.Uint64(buf[word:]))

			// WRITE with immediate consumes a receive and brings the
			// immediate; the data lands where the writer said.
			_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 10}}, 0)
			require.NoError(t, err)
			copy(buf[3000:], "imm")
			_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 5, Opcode: vfrdma.OpRDMAWriteWithImm, Imm: 0xC0FFEE, SGEs: []vfrdma.SGE{p.mr.SGE(3000, 3)}, RemoteAddr: remote + 100, RKey: p.mr.RKey()}}, 0)
			require.NoError(t, err)
			for _, wc := range waitWCs(t, ctx, p.cq, 2) {
				require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
				if wc.WRID == 10 {
					assert.Equal(t, vfrdma.WCRecvRDMAWithImm, wc.Opcode)
					assert.True(t, wc.HasImm())
					assert.EqualValues(t, 0xC0FFEE, wc.Imm)
				}
			}
			assert.Equal(t, "imm", string(buf[32768+100:32768+103]))
		})
	}
}

// A one-sided operation the remote MR does not allow completes with a
// remote access error, and the device reports the QP's failure.
func TestModelRemoteAccessViolation(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite) // no remote rights
	_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: 1, Opcode: vfrdma.OpRDMAWrite, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}, RemoteAddr: p.mr.Addr() + 4096, RKey: p.mr.RKey()}}, 0)
	require.NoError(t, err)
	wc := waitWCs(t, ctx, p.cq, 1)[0]
	assert.Equal(t, vfrdma.WCRemAccessErr, wc.Status, "%+v", wc)
}

// On QEMU 7.2 one-sided operations and atomics are refused before anything
// reaches the ring: QEMU would send each as a SEND.
func TestModelOneSidedRefusedOnQEMU(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, pvsim.Config{QEMU: true}, nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite|vfrdma.AccessRemoteWrite)
	before := m.Stats()
	for _, op := range []vfrdma.Opcode{vfrdma.OpRDMAWrite, vfrdma.OpRDMARead, vfrdma.OpRDMAWriteWithImm, vfrdma.OpAtomicCmpSwap, vfrdma.OpAtomicFetchAdd, vfrdma.OpSendWithImm} {
		_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: 1, Opcode: op, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}, RemoteAddr: p.mr.Addr(), RKey: p.mr.RKey()}}, 0)
		assert.ErrorIs(t, err, vfrdma.ErrNotSupported, op.String())
	}
	assert.Equal(t, before.SendWQEs, m.Stats().SendWQEs, "nothing reached the ring")
}

// Unsignaled sends on a device that honours the flag make no completion,
// and the send queue still drains: many times its depth goes through.
func TestModelUnsignaledSendsDrainTheQueue(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, false, vfrdma.AccessLocalWrite)
	const total = 32 * 8
	recvs := make([]vfrdma.RecvWR, 1)
	signaled := 0
	for i := range total {
		recvs[0] = vfrdma.RecvWR{WRID: uint64(i), SGEs: []vfrdma.SGE{p.mr.SGE(4096, 64)}}
		for {
			_, err := p.b.PostRecv(recvs, 0)
			if err == nil {
				break
			}
			require.ErrorIs(t, err, vfrdma.ErrQueueFull)
			drain(t, p.cq)
		}
		var flags vfrdma.SendFlags
		if i%16 == 15 {
			flags = vfrdma.SendSignaled
			signaled++
		}
		for {
			_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: uint64(i), Flags: flags, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, 0)
			if err == nil {
				break
			}
			require.ErrorIs(t, err, vfrdma.ErrQueueFull, "send %d", i)
			drain(t, p.cq)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		send, _ := p.a.Outstanding()
		if send == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "sends still outstanding: %d", send)
		drain(t, p.cq)
	}
}

func drain(t *testing.T, cq *vfrdma.CQ) {
	t.Helper()
	buf := make([]vfrdma.WC, 64)
	n, err := cq.Poll(buf)
	require.NoError(t, err)
	for _, wc := range buf[:n] {
		require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
	}
	if n == 0 {
		time.Sleep(time.Millisecond)
	}
}

// Every async event the model raises reaches the user, acted on.
func TestModelAsyncEvents(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	next := func() vfrdma.AsyncEvent {
		t.Helper()
		select {
		case ev := <-d.AsyncEvents():
			return ev
		case <-ctx.Done():
			require.FailNow(t, "no async event")
		}
		return vfrdma.AsyncEvent{}
	}

	require.NoError(t, m.SetPort(false))
	ev := next()
	assert.Equal(t, vfrdma.EventPortErr, ev.Type)
	assert.Equal(t, vfrdma.PortDown, d.PortState())
	require.NoError(t, m.SetPort(true))
	assert.Equal(t, vfrdma.EventPortActive, next().Type)
	assert.Equal(t, vfrdma.PortActive, d.PortState())

	info, ok := m.QPByNumber(p.a.QPN())
	require.True(t, ok)
	require.NoError(t, m.ErrorQP(info.Handle))
	ev = next()
	assert.Equal(t, vfrdma.EventQPFatal, ev.Type)
	assert.Same(t, p.a, ev.QP, "found by its handle")
	assert.Equal(t, vfrdma.StateErr, p.a.State())

	require.NoError(t, m.OverflowCQ(p.cq.Handle()))
	ev = next()
	assert.Equal(t, vfrdma.EventCQErr, ev.Type)
	assert.Same(t, p.cq, ev.CQ)
	_, err := p.cq.Poll(make([]vfrdma.WC, 4))
	assert.ErrorIs(t, err, vfrdma.ErrCQOverrun)

	cq2, err := d.CreateCQ(ctx, 16)
	require.NoError(t, err)
	require.NoError(t, m.Fatal())
	assert.Equal(t, vfrdma.EventDeviceFatal, next().Type)
	_, err = cq2.Poll(make([]vfrdma.WC, 4))
	assert.ErrorIs(t, err, vfrdma.ErrDeviceFatal)
	st, err := d.AsyncStats()
	require.NoError(t, err)
	assert.EqualValues(t, 5, st.Events)
}

// A command the device never answers times out with the command named; one
// it answers with an error fails with it; neither breaks the next command.
func TestModelCommandFaults(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), &vfrdma.Options{CommandTimeout: 200 * time.Millisecond})
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreatePD, Hang: true}))
	_, err := d.AllocPD(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreateCQ, Errno: 12}))
	_, err = d.CreateCQ(ctx, 16)
	require.Error(t, err)
	_, err = d.AllocPD(ctx)
	assert.NoError(t, err, "the channel works on")
}

// Device.Close closes the AsyncEvents channel: a range over it ends.
func TestModelCloseEndsTheAsyncEvents(t *testing.T) {
	d, m := openModel(t, vmware(20), nil)
	require.NoError(t, m.SetPort(false))
	ended := make(chan int)
	go func() {
		n := 0
		for range d.AsyncEvents() {
			n++
		}
		ended <- n
	}()
	require.Eventually(t, func() bool { st, _ := d.AsyncStats(); return st.Events == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, d.Close())
	select {
	case n := <-ended:
		assert.Equal(t, 1, n)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the range did not end at Close")
	}
}

// A device on the model has no VFIO: VFIOPath is empty.
func TestVFIOPathOfAModelDeviceIsEmpty(t *testing.T) {
	d, _ := openModel(t, vmware(19), nil)
	assert.Empty(t, d.VFIOPath())
}
