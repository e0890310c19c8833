package bridge

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

func openModel(t *testing.T) (*Context, *PD) {
	t.Helper()
	env := Env{Model: "v20"}
	devs, err := Devices(env)
	require.NoError(t, err)
	require.Len(t, devs, 1)
	c, err := Open(devs[0], env)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	pd, err := c.AllocPD()
	require.NoError(t, err)
	return c, pd
}

func TestWithNoBoundFunctionTheDeviceListIsEmptyNotAnError(t *testing.T) {
	s := pcitest.New(t)
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Bus: 3}, Vendor: 0x15ad, Device: 0x0820, IOMMUGroup: 2})
	devs, err := Devices(Env{Sysfs: s.Root})
	require.NoError(t, err)
	assert.Empty(t, devs, "a function not bound to vfio-pci is not listed")
	devs, err = Devices(Env{Sysfs: t.TempDir()})
	require.NoError(t, err)
	assert.Empty(t, devs)
}

func TestAModelOutsideV17ToV20IsRefused(t *testing.T) {
	for _, ok := range []string{"v17", "v20", "qemu", "v18,rocev2"} {
		_, err := ParseModel(ok)
		assert.NoError(t, err, ok)
	}
	for _, bad := range []string{"v16", "v21", "x", "v20,fast"} {
		_, err := ParseModel(bad)
		assert.Equal(t, syscall.EINVAL, Errno(err), bad)
	}
}

func TestErrnoIsTheProvidersValue(t *testing.T) {
	assert.Equal(t, syscall.Errno(0), Errno(nil))
	assert.Equal(t, syscall.ENOMEM, Errno(vfrdma.ErrQueueFull))
	assert.Equal(t, syscall.EINVAL, Errno(vfrdma.ErrQPState))
	assert.Equal(t, syscall.EINVAL, Errno(vfrdma.ErrPrivileges))
	assert.Equal(t, syscall.EBUSY, Errno(vfrdma.ErrBusy))
	assert.Equal(t, syscall.EOPNOTSUPP, Errno(ErrUnsupported))
}

func rcPair(t *testing.T, c *Context, pd *PD, sge int) (*CQ, *QP, *QP) {
	t.Helper()
	cq, err := c.CreateCQ(64, nil)
	require.NoError(t, err)
	mk := func() *QP {
		qp, err := pd.CreateQP(QPInit{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SignalAll: true,
			Cap: QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: sge, MaxRecvSGE: sge}})
		require.NoError(t, err)
		return qp
	}
	return cq, mk(), mk()
}

func TestModifyQPNeedsTheVerbsRequiredAttributes(t *testing.T) {
	c, pd := openModel(t)
	_, a, b := rcPair(t, c, pd, 1)
	init := &QPAttr{State: StateInit, Port: 1}
	err := a.Modify(init, MaskState|MaskPKeyIndex|MaskPort)
	assert.Equal(t, syscall.EINVAL, Errno(err), "RC RESET→INIT without ACCESS_FLAGS")
	require.NoError(t, a.Modify(init, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags))
	assert.Equal(t, StateInit, a.State())
	rts := &QPAttr{State: StateRTS}
	assert.Equal(t, syscall.EINVAL, Errno(a.Modify(rts, MaskState|MaskSQPSN)), "INIT→RTS skips RTR")
	rtr := &QPAttr{State: StateRTR, DestQPN: b.QPN(), AH: AHAttr{IsGlobal: true, DGID: c.Dev.GID(), PortNum: 1}}
	full := MaskState | MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRDAtomic | MaskMinRNRTimer
	assert.Equal(t, syscall.EINVAL, Errno(a.Modify(rtr, full&^MaskDestQPN)), "RTR without DEST_QPN")
	require.NoError(t, a.Modify(rtr, full))
	assert.Equal(t, syscall.EOPNOTSUPP, Errno(a.Modify(&QPAttr{State: StateReset}, MaskState)))
	require.NoError(t, a.Modify(&QPAttr{State: StateErr}, MaskState))
	assert.Equal(t, StateErr, a.State())
}

func TestAPostTakesSGEsUpToTheQPsMaxAndRefusesOnePast(t *testing.T) {
	c, pd := openModel(t)
	_, a, _ := rcPair(t, c, pd, 2)
	buf := make([]byte, 4096)
	mr, err := pd.RegMR(unsafe.Pointer(&buf[1]), 100, uint64(uintptr(unsafe.Pointer(&buf[1]))), 1)
	require.NoError(t, err)
	reqs := a.RecvReqs()
	for i := range 2 {
		reqs[0].SGEs[i] = vfrdma.SGE{Addr: uint64(uintptr(unsafe.Pointer(&buf[1]))), Length: 8, LKey: mr.LKey()}
	}
	reqs[0].NumSGE = 2 // the limit
	reqs[1] = RecvReq{NumSGE: 3, SGEs: reqs[1].SGEs}
	require.NoError(t, a.Modify(&QPAttr{State: StateInit, Port: 1}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags))
	n, err := a.PostRecv(2)
	assert.Equal(t, 1, n, "the request at the limit is posted")
	assert.Equal(t, syscall.EINVAL, Errno(err), "one past the limit is EINVAL")
}

func TestAPostOnAResetQPIsEINVALAndPostsNothing(t *testing.T) {
	c, pd := openModel(t)
	_, a, _ := rcPair(t, c, pd, 1)
	reqs := a.SendReqs()
	reqs[0] = SendReq{Opcode: WRSend, SGEs: reqs[0].SGEs}
	n, err := a.PostSend(1)
	assert.Equal(t, 0, n)
	assert.Equal(t, syscall.EINVAL, Errno(err))
}

func TestPollAllocatesNothing(t *testing.T) {
	c, _ := openModel(t)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() { _, _ = cq.Poll(32) })
	assert.Zero(t, allocs)
}

func TestAsyncEventsComeThroughTheFDWithTheirObjectOrPort(t *testing.T) {
	c, _ := openModel(t)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	var cstruct [8]byte
	cq.User = unsafe.Pointer(&cstruct)

	require.NoError(t, c.model.SetPort(false))
	e, err := c.NextAsyncEvent()
	require.NoError(t, err)
	assert.Equal(t, EventPortErr, e.Type)
	assert.Equal(t, 1, e.Port)

	require.NoError(t, c.model.OverflowCQ(cq.Handle()))
	e, err = c.NextAsyncEvent()
	require.NoError(t, err)
	assert.Equal(t, EventCQErr, e.Type)
	assert.Equal(t, unsafe.Pointer(&cstruct), e.User, "the event names the CQ's C structure")
}

func TestANonBlockingAsyncFDWithNoEventIsEAGAIN(t *testing.T) {
	c, _ := openModel(t)
	require.NoError(t, syscall.SetNonblock(c.AsyncFD(), true))
	_, err := c.NextAsyncEvent()
	assert.Equal(t, syscall.EAGAIN, Errno(err))
}
