package vmxnet3

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testIOVA = 0x10_0000_0000

// newTestNIC starts a NIC on a fakeDev. Its DMA memory is an anonymous
// mapping that Close unmaps, as Open's does: a driver access to it after
// Close faults (and fails the test); a register access after Close is
// counted in fakeDev.late; the fake vectors are closed, waking sleepers.
func newTestNIC(t testing.TB, o *Options) (*NIC, *fakeDev) {
	t.Helper()
	opts, err := o.withDefaults()
	require.NoError(t, err)
	l := computeLayout(&opts)
	mem, err := syscall.Mmap(-1, 0, l.size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	f := &fakeDev{mem: mem, base: testIOVA, mac: [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}, link: true, rxIRQ: newFakeIRQ(), evIRQ: newFakeIRQ()}
	n, err := start("fake", fakeBar{f, true}, fakeBar{f, false}, f.mem, testIOVA, f.rxIRQ, f.evIRQ, &opts)
	if err != nil {
		_ = syscall.Munmap(mem)
	}
	require.NoError(t, err)
	n.release = func() error {
		f.mu.Lock()
		f.released = true
		f.mu.Unlock()
		f.rxIRQ.close()
		f.evIRQ.close()
		return syscall.Munmap(mem)
	}
	t.Cleanup(func() {
		assert.NoError(t, n.Close())
		f.mu.Lock()
		defer f.mu.Unlock()
		assert.Zero(t, f.late, "register accesses after Close freed the NIC")
	})
	return n, f
}

func frame(size int, seed byte) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = seed + byte(i*13)
	}
	return b
}

// Bring-up leaves the device active with the shared area the sheet
// describes, the permanent MAC read, the link up; Close resets it.
func TestBringUpActivatesAndCloseResets(t *testing.T) {
	n, f := newTestNIC(t, nil)
	assert.True(t, f.active)
	assert.Equal(t, "52:54:00:12:34:56", n.MAC().String())
	assert.Equal(t, 1514, n.MaxFrame())
	link, err := n.Link()
	require.NoError(t, err)
	assert.Equal(t, Link{Up: true, Speed: 1000}, link)
	require.NoError(t, n.Close())
	assert.False(t, f.active, "closed: the device is quiesced and reset")
	assert.Zero(t, f.dsa)
	_, err = n.Link()
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, n.Close(), "Close is idempotent")
}

// A MAC given in Options is written after activation (which resets it).
func TestMACIsSetAfterActivation(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 7}
	n, f := newTestNIC(t, &Options{MAC: mac})
	assert.Equal(t, mac.String(), n.MAC().String())
	assert.Equal(t, [6]byte(mac), f.mac)
}

// Options out of range are refused before the device is touched.
func TestBadOptionsAreRefused(t *testing.T) {
	for _, o := range []Options{{TxRing: 100}, {RxRing: 8192}, {TxRing: 16}, {MTU: 60}, {MTU: 9000}, {MAC: net.HardwareAddr{1, 2, 3}}, {MAC: net.HardwareAddr{1, 0, 0, 0, 0, 1}}} {
		_, err := o.withDefaults()
		assert.ErrorIs(t, err, ErrInvalid, "%+v", o)
	}
}

// Frames go out whole and in order, several laps of the ring, short ones
// padded to 60 bytes; one doorbell per Send.
func TestSendPadsAndWrapsTheRing(t *testing.T) {
	n, f := newTestNIC(t, &Options{TxRing: 32})
	var want [][]byte
	for i := 0; i < 5*32; i += 10 {
		batch := make([][]byte, 10)
		for j := range batch {
			batch[j] = frame(14+(i+j)*9%1500, byte(i+j))
			w := batch[j]
			if len(w) < MinFrame {
				w = append(append([]byte(nil), w...), make([]byte, MinFrame-len(w))...)
			}
			want = append(want, w)
		}
		sent, err := n.Send(batch)
		require.NoError(t, err)
		require.Equal(t, 10, sent)
	}
	require.Len(t, f.wire, len(want))
	for i := range want {
		require.True(t, bytes.Equal(want[i], f.wire[i]), "frame %d", i)
	}
	s, err := n.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(len(want)), s.TxFrames)
	assert.Equal(t, uint64(len(want)/10), s.TxDoorbells)
}

// A bad frame size stops the batch: the frames before it are sent, it and
// those after are not.
func TestSendRefusesBadSizesAfterSendingWhatCameBefore(t *testing.T) {
	n, f := newTestNIC(t, nil)
	sent, err := n.Send([][]byte{frame(100, 1), frame(13, 2), frame(100, 3)})
	assert.ErrorIs(t, err, ErrFrameSize)
	assert.Equal(t, 1, sent)
	sent, err = n.Send([][]byte{frame(1515, 1)})
	assert.ErrorIs(t, err, ErrFrameSize)
	assert.Zero(t, sent)
	assert.Len(t, f.wire, 1)
}

// A device that stops completing fills the ring: ErrRingFull, with the
// frames that fit sent.
func TestSendReportsAFullRing(t *testing.T) {
	n, f := newTestNIC(t, &Options{TxRing: 32})
	f.hold = true
	batch := make([][]byte, 40)
	for i := range batch {
		batch[i] = frame(60, byte(i))
	}
	sent, err := n.Send(batch)
	assert.ErrorIs(t, err, ErrRingFull)
	assert.Equal(t, 32, sent)
	sent, err = n.Send(batch[:1])
	assert.ErrorIs(t, err, ErrRingFull, "still full")
	assert.Zero(t, sent)
	f.hold = false
	f.kick() // the device catches up
	sent, err = n.Send(batch[:1])
	require.NoError(t, err)
	assert.Equal(t, 1, sent)
	assert.Len(t, f.wire, 33)
}

// A completion that names another descriptor than the oldest in flight is
// a device fault, not a silent skip.
func TestSendChecksTheDevicesCompletions(t *testing.T) {
	n, f := newTestNIC(t, nil)
	f.badTxIdx = true
	_, err := n.Send([][]byte{frame(60, 1)})
	assert.ErrorIs(t, err, ErrDeviceFault)
}

// Frames come in whole and in order over several laps of the receive ring
// and of its completion ring; each buffer is given back as it is used.
func TestRecvWrapsTheRings(t *testing.T) {
	n, f := newTestNIC(t, &Options{RxRing: 32})
	bufs := make([][]byte, 7)
	for i := range bufs {
		bufs[i] = make([]byte, n.MaxFrame())
	}
	sizes := make([]int, len(bufs))
	next := 0
	for lap := 0; lap < 10; lap++ {
		for i := 0; i < 25; i++ {
			f.deliver(frame(60+(lap*25+i)*37%1454, byte(lap*25+i)))
		}
		for got := 0; got < 25; {
			k, err := n.Recv(bufs, sizes)
			require.NoError(t, err)
			require.NotZero(t, k)
			for i := range k {
				want := frame(60+next*37%1454, byte(next))
				require.Equal(t, want, bufs[i][:sizes[i]], "frame %d", next)
				next++
			}
			got += k
		}
	}
	k, err := n.Recv(bufs, sizes)
	require.NoError(t, err)
	assert.Zero(t, k)
	s, err := n.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(250), s.RxFrames)
	assert.Zero(t, s.RxDrops)
}

// With every buffer in use, the device drops what comes and counts it; the
// driver reports the count.
func TestRecvDropsAreTheDevicesCount(t *testing.T) {
	n, f := newTestNIC(t, &Options{RxRing: 32})
	for i := 0; i < 40; i++ {
		f.deliver(frame(100, byte(i)))
	}
	bufs := [][]byte{make([]byte, 2048)}
	sizes := []int{0}
	got := 0
	for {
		k, err := n.Recv(bufs, sizes)
		require.NoError(t, err)
		if k == 0 {
			break
		}
		got += k
	}
	s, err := n.Stats()
	require.NoError(t, err)
	assert.Equal(t, 32, got)
	assert.Equal(t, uint64(8), s.RxDrops)
}

// A buffer too small for the next frame stops Recv with ErrShortBuffer and
// loses nothing: the frame comes with the next call, into a buffer of
// exactly its length.
func TestRecvShortBufferLosesNothing(t *testing.T) {
	n, f := newTestNIC(t, nil)
	want := frame(1000, 9)
	f.deliver(want)
	sizes := []int{0}
	k, err := n.Recv([][]byte{make([]byte, 999)}, sizes)
	assert.ErrorIs(t, err, ErrShortBuffer)
	assert.Zero(t, k)
	buf := make([]byte, 1000) // exactly the frame's length
	k, err = n.Recv([][]byte{buf}, sizes)
	require.NoError(t, err)
	require.Equal(t, 1, k)
	assert.Equal(t, want, buf[:sizes[0]])
	_, err = n.Recv([][]byte{buf, buf}, sizes)
	assert.ErrorIs(t, err, ErrInvalid, "fewer sizes than buffers")
}

// RecvWait sleeps on the receive interrupt and wakes for a frame that
// lands while it sleeps; with none, the context bounds it.
func TestRecvWaitWakesOnTheInterrupt(t *testing.T) {
	n, f := newTestNIC(t, nil)
	bufs := [][]byte{make([]byte, 1514)}
	sizes := []int{0}
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.deliver(frame(200, 4))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := n.RecvWait(ctx, bufs, sizes)
	require.NoError(t, err)
	assert.Equal(t, 1, k)
	assert.Equal(t, frame(200, 4), bufs[0][:sizes[0]])
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, err = n.RecvWait(short, bufs, sizes)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// Send and Recv allocate nothing.
func TestDataPathAllocatesNothing(t *testing.T) {
	n, f := newTestNIC(t, nil)
	out := [][]byte{frame(60, 1), frame(1514, 2)}
	bufs := [][]byte{make([]byte, 1514), make([]byte, 1514)}
	sizes := make([]int, 2)
	in := frame(500, 3)
	f.discard = true
	assert.Zero(t, testing.AllocsPerRun(200, func() {
		if _, err := n.Send(out); err != nil {
			t.Fatal(err)
		}
	}), "Send")
	assert.Zero(t, testing.AllocsPerRun(200, func() {
		f.deliver(in)
		if k, err := n.Recv(bufs, sizes); err != nil || k != 1 {
			t.Fatal(k, err)
		}
	}), "Recv of a frame")
	assert.Zero(t, testing.AllocsPerRun(200, func() {
		if _, err := n.Recv(bufs, sizes); err != nil {
			t.Fatal(err)
		}
	}), "Recv of nothing")
}

// A link change is an event: WaitLinkChange wakes on it (on the event
// interrupt), counts it, and a change is never missed between two calls;
// Send refuses while the link is down rather than let the device drop the
// frames.
func TestLinkChangesAreEventsAndSendNeedsTheLink(t *testing.T) {
	n, f := newTestNIC(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		time.Sleep(30 * time.Millisecond)
		f.setLink(false)
	}()
	l, seen, err := n.WaitLinkChange(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, Link{Up: false, Speed: 1000}, l)
	assert.Equal(t, uint64(1), seen)
	sent, err := n.Send([][]byte{frame(60, 1)})
	assert.ErrorIs(t, err, ErrLinkDown)
	assert.Zero(t, sent)
	assert.Empty(t, f.wire)

	f.setLink(true) // before the call: still reported
	l, seen, err = n.WaitLinkChange(ctx, seen)
	require.NoError(t, err)
	assert.True(t, l.Up)
	assert.Equal(t, uint64(2), seen)
	_, err = n.Send([][]byte{frame(60, 1)})
	require.NoError(t, err)

	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, _, err = n.WaitLinkChange(short, seen)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "no change, no wake-up")
}

// fakeDev models what the driver relies on of QEMU 7.2's vmxnet3
// (docs/vmxnet3.md): the commands, the shared area and queue descriptors
// read at activation, the transmit ring processed on a TXPROD write with a
// completion per frame, the receive ring filled in order with one head
// buffer per frame, drops counted when no buffer is posted, and the
// generation bits of every ring. Its memory is the driver's DMA memory at
// IOVA base.
type fakeDev struct {
	mu   sync.Mutex
	mem  []byte
	base uint64
	mac  [6]byte

	lastCmd uint32
	active  bool
	dsal    uint32
	dsa     uint64
	macl    uint32
	imr     [25]bool
	link    bool

	txRing, txComp, rxRing, rxComp  uint64
	txSize, rxSize, rxCompSize      uint32
	txIdx, txGen, txCompIdx, txCGen uint32
	rxIdx, rxGen, rxCompIdx, rxCGen uint32
	txStats, rxStats                uint64 // IOVAs of the counters
	txErrors, rxOutOfBuf            uint64

	wire    [][]byte // frames sent
	discard bool     // do not keep them
	hold    bool     // TXPROD does nothing (a stuck device)
	// badTxIdx makes the next transmit completion name the wrong descriptor.
	badTxIdx bool
	rxIRQ    *fakeIRQ
	evIRQ    *fakeIRQ
	// released: the NIC's Close freed its memory; late counts register
	// accesses after that (a driver bug: the BARs are unmapped by then).
	released bool
	late     int
}

// setLink changes the link as QEMU's set_link does: the shared area's
// event bit set, the event vector raised.
func (f *fakeDev) setLink(up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.link = up
	if f.dsa == 0 {
		return
	}
	ecr := f.at(f.dsa+shECR, 4)
	atomicStore32(ecr, atomicLoad32(ecr)|ecrLink)
	f.evIRQ.pending = true
	if !f.imr[vecEvent] {
		f.imr[vecEvent] = true
		f.evIRQ.fire()
	}
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

func (f *fakeDev) at(iova uint64, n int) []byte {
	off := iova - f.base
	return f.mem[off : off+uint64(n)]
}

type fakeBar struct {
	f  *fakeDev
	pt bool
}

func (b fakeBar) Load32(off int) (uint32, error) {
	f := b.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.released {
		f.late++
		return 0, nil
	}
	if b.pt {
		return 0, nil
	}
	switch off {
	case regVRRS, regUVRS:
		return 1, nil
	case regCMD:
		switch f.lastCmd {
		case cmdActivate:
			if f.active {
				return 0, nil
			}
			return 1, nil
		case cmdGetLink:
			v := uint32(1000 << 16)
			if f.link {
				v |= 1
			}
			return v, nil
		case cmdGetPermMAC:
			return le32(f.mac[0:4]), nil
		case cmdGetPermMAC + 1:
			return uint32(f.mac[4]) | uint32(f.mac[5])<<8, nil
		}
		return 0, nil
	}
	return 0, nil
}

func (b fakeBar) Store32(off int, v uint32) error {
	f := b.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.released {
		f.late++
		return nil
	}
	if b.pt {
		switch {
		case off < 25*8:
			if f.active {
				f.imr[off/8] = v != 0
				if v == 0 && f.rxIRQ != nil && off/8 == vecRx && f.rxIRQ.pending {
					f.imr[vecRx] = true
					f.rxIRQ.fire()
				}
				if v == 0 && f.evIRQ != nil && off/8 == vecEvent && f.evIRQ.pending {
					f.imr[vecEvent] = true
					f.evIRQ.fire()
				}
			}
		case off == regTXPROD:
			if f.active && !f.hold {
				f.processTx()
			}
		}
		return nil
	}
	switch off {
	case regDSAL:
		f.dsal, f.dsa = v, 0
		if v == 0 {
			f.active = false
		}
	case regDSAH:
		f.dsa = uint64(f.dsal) | uint64(v)<<32
	case regECR:
		if f.dsa != 0 {
			ecr := f.at(f.dsa+shECR, 4)
			atomicStore32(ecr, atomicLoad32(ecr)&^v)
		}
	case regMACL:
		f.macl = v
	case regMACH:
		binary.LittleEndian.PutUint32(f.mac[0:4], f.macl)
		f.mac[4], f.mac[5] = byte(v), byte(v>>8)
	case regCMD:
		f.lastCmd = v
		switch v {
		case cmdActivate:
			f.activate()
		case cmdQuiesce:
			f.active = false
		case cmdReset:
			f.active, f.dsa = false, 0
			for i := range f.imr {
				f.imr[i] = true
			}
		case cmdGetStats:
			if f.active {
				binary.LittleEndian.PutUint64(f.at(f.txStats+8*8, 8), f.txErrors)
				binary.LittleEndian.PutUint64(f.at(f.rxStats+8*8, 8), f.rxOutOfBuf)
			}
		}
	}
	return nil
}

func (f *fakeDev) activate() {
	if f.active || f.dsa == 0 {
		return
	}
	sh := f.at(f.dsa, sharedSize)
	if le32(sh[shMagic:]) != sharedMagic || sh[shNumTxQueues] != 1 || sh[shNumRxQueues] != 1 {
		return
	}
	if mtu := le32(sh[shMTU:]); mtu < 60 || mtu > 9000 {
		return
	}
	q := le64(sh[shQueueDescPA:])
	tq, rq := f.at(q, queueDescSize), f.at(q+queueDescSize, queueDescSize)
	f.txRing, f.txComp, f.txSize = le64(tq[tqRingPA:]), le64(tq[tqCompPA:]), le32(tq[tqRingSize:])
	f.rxRing, f.rxComp, f.rxSize, f.rxCompSize = le64(rq[rqRing0PA:]), le64(rq[rqCompPA:]), le32(rq[rqRing0Size:]), le32(rq[rqCompSize:])
	f.txStats, f.rxStats = q+tqStats, q+queueDescSize+rqStats
	clear(f.at(f.txComp, int(f.txSize)*descSize))
	clear(f.at(f.rxComp, int(f.rxCompSize)*descSize))
	f.txIdx, f.txGen, f.txCompIdx, f.txCGen = 0, 1, 0, 1
	f.rxIdx, f.rxGen, f.rxCompIdx, f.rxCGen = 0, 1, 0, 1
	f.active = true
}

func (f *fakeDev) processTx() {
	for {
		d := f.at(f.txRing+uint64(f.txIdx)*descSize, descSize)
		w2 := atomicLoad32(d[8:])
		if (w2>>14)&1 != f.txGen {
			return
		}
		n := int(w2 & txLenMask)
		if n == 0 {
			n = 16384
		}
		if !f.discard {
			f.wire = append(f.wire, append([]byte(nil), f.at(le64(d[0:]), n)...))
		}
		idx := f.txIdx
		if f.badTxIdx {
			idx, f.badTxIdx = idx+1, false
		}
		c := f.at(f.txComp+uint64(f.txCompIdx)*descSize, descSize)
		binary.LittleEndian.PutUint32(c[0:], idx)
		atomicStore32(c[12:], f.txCGen<<31)
		if f.txIdx++; f.txIdx == f.txSize {
			f.txIdx, f.txGen = 0, f.txGen^1
		}
		if f.txCompIdx++; f.txCompIdx == f.txSize {
			f.txCompIdx, f.txCGen = 0, f.txCGen^1
		}
	}
}

// kick makes the device look at its transmit ring, as hardware does on
// its own once it catches up.
func (f *fakeDev) kick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.processTx()
}

// deliver puts a frame on the receive path, as QEMU does on a frame from
// its backend: frames shorter than 60 bytes are padded; with no buffer
// posted it is dropped and counted.
func (f *fakeDev) deliver(frame []byte) {
	if !f.tryDeliver(frame) {
		panic("deliver to an inactive device")
	}
}

// tryDeliver is deliver that reports false, and does nothing, when the
// device is not active (the NIC closed it).
func (f *fakeDev) tryDeliver(frame []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.active {
		return false
	}
	if len(frame) < 60 {
		frame = append(append([]byte(nil), frame...), make([]byte, 60-len(frame))...)
	}
	d := f.at(f.rxRing+uint64(f.rxIdx)*descSize, descSize)
	w2 := atomicLoad32(d[8:])
	if w2>>31 != f.rxGen {
		f.rxOutOfBuf++
		return true
	}
	capacity := int(w2 & rxLenMask)
	n, trunc := len(frame), uint32(0)
	if n > capacity {
		n, trunc = capacity, rxcErr
	}
	copy(f.at(le64(d[0:]), n), frame)
	c := f.at(f.rxComp+uint64(f.rxCompIdx)*descSize, descSize)
	binary.LittleEndian.PutUint32(c[0:], f.rxIdx|rxcSOP|rxcEOP)
	binary.LittleEndian.PutUint32(c[4:], 0)
	binary.LittleEndian.PutUint32(c[8:], uint32(n)|trunc)
	atomicStore32(c[12:], f.rxCGen<<31) // the generation last: the driver may be looking
	if f.rxIdx++; f.rxIdx == f.rxSize {
		f.rxIdx, f.rxGen = 0, f.rxGen^1
	}
	if f.rxCompIdx++; f.rxCompIdx == f.rxCompSize {
		f.rxCompIdx, f.rxCGen = 0, f.rxCGen^1
	}
	if f.rxIRQ != nil {
		f.rxIRQ.pending = true
		if !f.imr[vecRx] {
			f.imr[vecRx] = true // auto-mask
			f.rxIRQ.fire()
		}
	}
	return true
}

// fakeIRQ is an eventfd-like vector: fire adds one, Poll and Wait take
// all; close wakes a waiter with errIRQClosed, as vfio.Vector's does.
type fakeIRQ struct {
	pending bool
	ch      chan struct{}
	closed  chan struct{}
	once    sync.Once
}

var errIRQClosed = errors.New("fake vector closed")

func newFakeIRQ() *fakeIRQ { return &fakeIRQ{ch: make(chan struct{}, 1), closed: make(chan struct{})} }

func (q *fakeIRQ) fire() {
	q.pending = false
	select {
	case q.ch <- struct{}{}:
	default:
	}
}

func (q *fakeIRQ) close() { q.once.Do(func() { close(q.closed) }) }

func (q *fakeIRQ) Poll() (uint64, error) {
	select {
	case <-q.closed:
		return 0, errIRQClosed
	default:
	}
	select {
	case <-q.ch:
		return 1, nil
	default:
		return 0, nil
	}
}

func (q *fakeIRQ) Wait(ctx context.Context) (uint64, error) {
	select {
	case <-q.closed:
		return 0, errIRQClosed
	case <-q.ch:
		return 1, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("wait: %w", ctx.Err())
	}
}
