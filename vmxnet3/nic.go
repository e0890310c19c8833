package vmxnet3

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

var le = binary.LittleEndian

// Register is a BAR of the function: 32-bit loads and stores at byte
// offsets. *mmio.Region satisfies it; the host tests put a device model
// behind it.
type Register interface {
	Load32(off int) (uint32, error)
	Store32(off int, v uint32) error
}

// Waiter is an interrupt vector: *vfio.Vector satisfies it.
type Waiter interface {
	Wait(ctx context.Context) (uint64, error)
	Poll() (uint64, error)
}

// Options tune the NIC. The zero value is valid.
type Options struct {
	// TxRing and RxRing are the descriptor counts of the transmit ring and
	// of the receive ring (one buffer each): multiples of 32 up to 4096.
	// Defaults 256 and 512.
	TxRing, RxRing int
	// MTU is the largest payload after the 14-byte Ethernet header, 68 to
	// 4078 (a frame and its VLAN tag fit one 4 KiB buffer). Default 1500.
	MTU int
	// MAC, when set, replaces the function's permanent address.
	MAC net.HardwareAddr
	// Multicast receives multicast frames too; Promiscuous receives
	// everything on the link. By default: frames to the NIC's own address
	// and broadcasts.
	Multicast, Promiscuous bool
}

const (
	defaultTxRing = 256
	defaultRxRing = 512
	defaultMTU    = 1500
	minMTU        = 68
	maxMTU        = 4096 - 14 - 4
	// MinFrame is the shortest Ethernet frame on the wire without its FCS;
	// Send pads shorter ones with zeros, as a NIC does.
	MinFrame = 60
	// HeaderLen is the Ethernet header: what a frame holds at the least.
	HeaderLen = 14
	// ring 1 takes body buffers of frames larger than a head buffer, which
	// this driver never lets happen (one buffer per frame); it is given the
	// smallest size the device expects and left empty.
	ring1Size = 32
)

func (o *Options) withDefaults() (Options, error) {
	v := Options{}
	if o != nil {
		v = *o
	}
	if v.TxRing == 0 {
		v.TxRing = defaultTxRing
	}
	if v.RxRing == 0 {
		v.RxRing = defaultRxRing
	}
	if v.MTU == 0 {
		v.MTU = defaultMTU
	}
	for _, r := range []struct {
		what string
		n    int
	}{{"TxRing", v.TxRing}, {"RxRing", v.RxRing}} {
		if r.n < ringSizeMultiple || r.n > maxRingSize || r.n%ringSizeMultiple != 0 {
			return v, invalidf("%s %d: want a multiple of %d from %d to %d", r.what, r.n, ringSizeMultiple, ringSizeMultiple, maxRingSize)
		}
	}
	if v.MTU < minMTU || v.MTU > maxMTU {
		return v, invalidf("MTU %d: want %d to %d", v.MTU, minMTU, maxMTU)
	}
	if v.MAC != nil && (len(v.MAC) != 6 || v.MAC[0]&1 != 0) {
		return v, invalidf("MAC %v: want a 6-byte unicast address", v.MAC)
	}
	return v, nil
}

// Stats are the NIC's counters: the driver's own, and the device's (as of
// the Stats call).
type Stats struct {
	TxFrames    uint64 `json:"tx_frames"`    // handed to the device
	TxBytes     uint64 `json:"tx_bytes"`     //
	TxDoorbells uint64 `json:"tx_doorbells"` // TXPROD writes: one per Send that sent
	TxErrors    uint64 `json:"tx_errors"`    // frames the device completed but could not send (its count)
	RxFrames    uint64 `json:"rx_frames"`    // delivered to the caller
	RxBytes     uint64 `json:"rx_bytes"`     //
	RxTruncated uint64 `json:"rx_truncated"` // frames larger than a buffer, dropped by the driver
	RxDrops     uint64 `json:"rx_drops"`     // frames the device dropped for want of a buffer (its count)
	RxWaits     uint64 `json:"rx_waits"`     // RecvWait sleeps on the receive interrupt
}

// Link is the link state the device reports.
type Link struct {
	Up    bool
	Speed int // Mbit/s
}

func (l Link) String() string {
	if !l.Up {
		return "down"
	}
	return fmt.Sprintf("up %d Mbit/s", l.Speed)
}

// NIC is an activated vmxnet3 function. Send and Recv (and RecvWait) may
// run in two goroutines at once, one each; the control calls (Link,
// WaitLinkChange, Stats, Close) are safe for concurrent use, and Close is
// safe beside every call.
//
// Lifecycle: after Close every method that can fail returns an error
// wrapping ErrClosed (Name, MAC, MTU, MaxFrame and LinkChanges keep
// answering from what the NIC remembers); a call racing Close either
// completes or returns ErrClosed; Close waits for the calls in progress
// before it frees the device memory they use, and wakes RecvWait and
// WaitLinkChange sleepers (they return ErrClosed). A second Close returns
// nil.
type NIC struct {
	name            string
	pt              Register // BAR0
	vd              Register // BAR1
	mem             []byte   // DMA memory: shared area, queue descriptors, rings, buffers
	shared          []byte   // the driver-shared area
	iova            uint64
	rxIRQ, eventIRQ Waiter
	mac             net.HardwareAddr
	mtu             int
	maxFrame        int

	tx txRing
	rx rxRing

	// Every call that touches device memory passes one of the gates:
	// Send the transmit one, Recv the receive one, the rest the control
	// one. Close shuts them and waits for the calls inside.
	txGate, rxGate, ctlGate gate
	closeMu                 sync.Mutex // serialises Close: a second one waits for the first

	mu          sync.Mutex // the command register, rxMode
	rxMode      uint32
	linkDown    atomic.Bool   // as last read from the device
	linkChanges atomic.Uint64 // link-change events acknowledged
	count       struct {
		txFrames, txBytes, txDoorbells atomic.Uint64
		rxFrames, rxBytes, rxTrunc     atomic.Uint64
		rxWaits                        atomic.Uint64
	}
	release func() error // frees what Open took; nil for a NIC over test memory
}

// layout is where everything lies in the DMA memory.
type layout struct {
	shared, queues           int
	txRing, txComp           int
	rxRing0, rxRing1, rxComp int
	txBufs, rxBufs           int
	bufSize                  int
	size                     int
}

func computeLayout(o *Options) layout {
	var l layout
	at := 0
	take := func(n, align int) int {
		at = (at + align - 1) &^ (align - 1)
		off := at
		at += n
		return off
	}
	l.shared = take(sharedSize, 8)
	l.queues = take(2*queueDescSize, queueDescAlign)
	l.txRing = take(o.TxRing*descSize, ringAlign)
	l.txComp = take(o.TxRing*descSize, ringAlign)
	l.rxRing0 = take(o.RxRing*descSize, ringAlign)
	l.rxRing1 = take(ring1Size*descSize, ringAlign)
	l.rxComp = take((o.RxRing+ring1Size)*descSize, ringAlign)
	// Buffers: a power of two that holds the largest frame, so that none
	// crosses a 4 KiB page (the device maps each fragment as one piece).
	l.bufSize = 1024
	for l.bufSize < o.MTU+HeaderLen+4 {
		l.bufSize *= 2
	}
	l.txBufs = take(o.TxRing*l.bufSize, 4096)
	l.rxBufs = take(o.RxRing*l.bufSize, 4096)
	l.size = (at + 4095) &^ 4095
	return l
}

// start lays the NIC out in mem (zeroed, at IOVA iova, l.size bytes) and
// brings the function up: reset, version selection, the shared area and
// queues, receive buffers posted, activation, the MAC. The registers must
// be reachable and bus mastering on.
func start(name string, pt, vd Register, mem []byte, iova uint64, rxIRQ, eventIRQ Waiter, o *Options) (*NIC, error) {
	l := computeLayout(o)
	if len(mem) < l.size {
		return nil, invalidf("%d bytes of DMA memory: the NIC needs %d", len(mem), l.size)
	}
	n := &NIC{name: name, pt: pt, vd: vd, mem: mem, iova: iova, rxIRQ: rxIRQ, eventIRQ: eventIRQ,
		mtu: o.MTU, maxFrame: o.MTU + HeaderLen}
	// Reset first: the function has no FLR, so whatever the last user
	// left (an active device, unmasked interrupts) is still there.
	if err := n.command(cmdReset); err != nil {
		return nil, err
	}
	for _, v := range []struct {
		reg  int
		what string
	}{{regVRRS, "device revision"}, {regUVRS, "UPT version"}} {
		got, err := vd.Load32(v.reg)
		if err != nil {
			return nil, n.opErr("read "+v.what, err)
		}
		if got&1 == 0 {
			return nil, n.opErr("select "+v.what, fmt.Errorf("%w: the device offers %#x, not 1", ErrUnsupported, got))
		}
		if err := vd.Store32(v.reg, 1); err != nil {
			return nil, n.opErr("select "+v.what, err)
		}
	}
	lo, err := n.query(cmdGetPermMAC)
	if err != nil {
		return nil, err
	}
	hi, err := n.query(cmdGetPermMAC + 1)
	if err != nil {
		return nil, err
	}
	n.mac = net.HardwareAddr{byte(lo), byte(lo >> 8), byte(lo >> 16), byte(lo >> 24), byte(hi), byte(hi >> 8)}

	clear(mem[:l.size])
	n.rxMode = rxModeUcast | rxModeBcast
	if o.Multicast {
		n.rxMode |= rxModeMcast | rxModeAllMulti
	}
	if o.Promiscuous {
		n.rxMode |= rxModePromisc | rxModeMcast | rxModeAllMulti
	}
	sh := mem[l.shared : l.shared+sharedSize]
	n.shared = sh
	le.PutUint32(sh[shMagic:], sharedMagic)
	le.PutUint32(sh[shGOS:], gos64Linux)
	le.PutUint32(sh[shRevSpt:], 1)
	le.PutUint32(sh[shUPTVerSpt:], 1)
	le.PutUint64(sh[shUPTFeatures:], 0)
	le.PutUint64(sh[shQueueDescPA:], iova+uint64(l.queues))
	le.PutUint32(sh[shQueueDescLen:], 2*queueDescSize)
	le.PutUint32(sh[shMTU:], uint32(o.MTU))
	le.PutUint16(sh[shMaxRxSG:], 1)
	sh[shNumTxQueues], sh[shNumRxQueues] = 1, 1
	sh[shAutoMask] = 1 // a fired vector masks itself: a waiter unmasks it
	sh[shNumIntrs] = numVecs
	sh[shEventIntrIdx] = vecEvent
	le.PutUint32(sh[shIntrCtrl:], 0)
	le.PutUint32(sh[shRxMode:], n.rxMode)
	le.PutUint32(sh[shVFTable:], 1) // VLAN 0 (untagged) allowed

	tq := mem[l.queues : l.queues+queueDescSize]
	le.PutUint64(tq[tqRingPA:], iova+uint64(l.txRing))
	le.PutUint64(tq[tqCompPA:], iova+uint64(l.txComp))
	le.PutUint32(tq[tqRingSize:], uint32(o.TxRing))
	le.PutUint32(tq[tqCompSize:], uint32(o.TxRing))
	tq[tqIntrIdx] = vecTx
	rq := mem[l.queues+queueDescSize : l.queues+2*queueDescSize]
	le.PutUint64(rq[rqRing0PA:], iova+uint64(l.rxRing0))
	le.PutUint64(rq[rqRing1PA:], iova+uint64(l.rxRing1))
	le.PutUint64(rq[rqCompPA:], iova+uint64(l.rxComp))
	le.PutUint32(rq[rqRing0Size:], uint32(o.RxRing))
	le.PutUint32(rq[rqRing1Size:], ring1Size)
	le.PutUint32(rq[rqCompSize:], uint32(o.RxRing+ring1Size))
	rq[rqIntrIdx] = vecRx

	n.tx.init(mem, iova, l, o.TxRing)
	n.rx.init(mem, iova, l, o.RxRing)
	n.tx.stats = tq[tqStats : tqStats+8*statsEntries]
	n.rx.stats = rq[rqStats : rqStats+8*statsEntries]
	n.rx.postAll()

	if err := vd.Store32(regDSAL, uint32(iova+uint64(l.shared))); err != nil {
		return nil, n.opErr("write the shared area address", err)
	}
	if err := vd.Store32(regDSAH, uint32((iova+uint64(l.shared))>>32)); err != nil {
		return nil, n.opErr("write the shared area address", err)
	}
	res, err := n.query(cmdActivate)
	if err != nil {
		return nil, err
	}
	if res != 0 {
		return nil, n.opErr("activate", fmt.Errorf("%w: the device refused activation (result %#x)", ErrDevice, res))
	}
	if _, err := n.queryLinkLocked(); err != nil {
		return nil, err
	}
	// A MAC written before activation is lost: the device resets it to the
	// permanent one when it activates.
	if o.MAC != nil {
		if err := n.setMAC(o.MAC); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (n *NIC) setMAC(mac net.HardwareAddr) error {
	if err := n.vd.Store32(regMACL, le.Uint32(mac[0:4])); err != nil {
		return n.opErr("set the MAC", err)
	}
	if err := n.vd.Store32(regMACH, uint32(le.Uint16(mac[4:6]))); err != nil {
		return n.opErr("set the MAC", err)
	}
	n.mac = append(net.HardwareAddr(nil), mac...)
	return nil
}

// command writes a command whose result nobody reads. (Reading the result
// of some commands makes QEMU print a warning on its console.)
func (n *NIC) command(cmd uint32) error {
	if err := n.vd.Store32(regCMD, cmd); err != nil {
		return n.opErr(fmt.Sprintf("command %#x", cmd), err)
	}
	return nil
}

// query writes a command and reads its result.
func (n *NIC) query(cmd uint32) (uint32, error) {
	if err := n.command(cmd); err != nil {
		return 0, err
	}
	v, err := n.vd.Load32(regCMD)
	if err != nil {
		return 0, n.opErr(fmt.Sprintf("command %#x", cmd), err)
	}
	return v, nil
}

// Name returns the function's name (its PCI address).
func (n *NIC) Name() string { return n.name }

// MAC returns the NIC's address.
func (n *NIC) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), n.mac...) }

// MTU returns the largest payload after the Ethernet header.
func (n *NIC) MTU() int { return n.mtu }

// MaxFrame returns the largest frame Send takes and Recv returns: the MTU
// plus the 14-byte header.
func (n *NIC) MaxFrame() int { return n.maxFrame }

// Link asks the device for its link state (and takes note of a change the
// device signalled).
func (n *NIC) Link() (Link, error) {
	if !n.ctlGate.Enter() {
		return Link{}, n.opErr("get link", ErrClosed)
	}
	defer n.ctlGate.Exit()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.noteLinkChangeLocked(); err != nil {
		return Link{}, err
	}
	return n.queryLinkLocked()
}

func (n *NIC) queryLinkLocked() (Link, error) {
	v, err := n.query(cmdGetLink)
	if err != nil {
		return Link{}, err
	}
	l := Link{Up: v&linkUp != 0, Speed: int(v >> 16)}
	n.linkDown.Store(!l.Up)
	return l, nil
}

// noteLinkChangeLocked acknowledges a link change the device signalled in
// the shared area (its event bit), reads the new state and counts the
// change. n.mu is held.
func (n *NIC) noteLinkChangeLocked() error {
	if atomicLoad32(n.shared[shECR:])&ecrLink == 0 {
		return nil
	}
	if err := n.vd.Store32(regECR, ecrLink); err != nil {
		return n.opErr("acknowledge a link change", err)
	}
	if _, err := n.queryLinkLocked(); err != nil {
		return err
	}
	n.linkChanges.Add(1)
	return nil
}

// checkLink is the data path's look at the link: one load of the shared
// area's event word, and the device asked only when it signalled a change.
// The caller is inside a gate.
func (n *NIC) checkLink() error {
	if atomicLoad32(n.shared[shECR:])&ecrLink != 0 {
		n.mu.Lock()
		err := n.noteLinkChangeLocked()
		n.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if n.linkDown.Load() {
		return ErrLinkDown
	}
	return nil
}

// LinkChanges counts the link changes seen since Open.
func (n *NIC) LinkChanges() uint64 { return n.linkChanges.Load() }

// WaitLinkChange waits, sleeping on the device's event interrupt, until
// more than seen link changes have been counted since Open, and returns
// the link state then and the new count. Pass 0 first, then the count it
// returned: no change between two calls is missed.
func (n *NIC) WaitLinkChange(ctx context.Context, seen uint64) (Link, uint64, error) {
	if n.ctlGate.IsShut() {
		return Link{}, 0, n.opErr("wait for a link change", ErrClosed)
	}
	if n.eventIRQ == nil {
		return Link{}, 0, n.opErr("wait for a link change", fmt.Errorf("%w: the NIC has no event interrupt", ErrUnsupported))
	}
	for {
		if !n.ctlGate.Enter() {
			return Link{}, 0, n.opErr("wait for a link change", ErrClosed)
		}
		n.mu.Lock()
		// Forget wake-ups already seen, look, unmask; then sleep until the
		// vector fires (it masks itself when it does). A change signalled
		// after the look leaves the vector pending, and unmasking a pending
		// vector fires it at once.
		_, err := n.eventIRQ.Poll()
		if err == nil {
			err = n.noteLinkChangeLocked()
		}
		if err == nil && n.linkChanges.Load() > seen {
			l, qerr := n.queryLinkLocked()
			n.mu.Unlock()
			n.ctlGate.Exit()
			return l, n.linkChanges.Load(), qerr
		}
		if err == nil {
			err = n.pt.Store32(regIMR+8*vecEvent, 0)
		}
		n.mu.Unlock()
		n.ctlGate.Exit()
		if err != nil {
			return Link{}, 0, n.opErr("wait for a link change", n.closedOr(&n.ctlGate, err))
		}
		// The sleep is outside the gate: Close does not wait for it, it
		// wakes it (closing the vector).
		if _, err := n.eventIRQ.Wait(ctx); err != nil {
			return Link{}, 0, n.opErr("wait for a link change", n.closedOr(&n.ctlGate, err))
		}
	}
}

// Stats returns the counters. The device's own (transmit errors, receive
// drops for want of buffers) are fetched with a GET_STATS command.
func (n *NIC) Stats() (Stats, error) {
	s := Stats{
		TxFrames: n.count.txFrames.Load(), TxBytes: n.count.txBytes.Load(), TxDoorbells: n.count.txDoorbells.Load(),
		RxFrames: n.count.rxFrames.Load(), RxBytes: n.count.rxBytes.Load(), RxTruncated: n.count.rxTrunc.Load(),
		RxWaits: n.count.rxWaits.Load(),
	}
	if !n.ctlGate.Enter() {
		return s, n.opErr("get stats", ErrClosed)
	}
	defer n.ctlGate.Exit()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.command(cmdGetStats); err != nil {
		return s, err
	}
	// UPT1 counters, 8 bytes each: entry 8 is pktsTxError (tx) and
	// pktsRxOutOfBuf (rx).
	s.TxErrors = atomicLoad64(n.tx.stats[8*8:])
	s.RxDrops = atomicLoad64(n.rx.stats[8*8:])
	return s, nil
}

// Close quiesces and resets the function (the paired RDMA port reads DOWN
// from then on) and frees what Open took. Calls that have begun finish
// first; calls that begin from then on, and sleepers in RecvWait and
// WaitLinkChange, return ErrClosed. A second Close returns nil (once the
// first has finished).
func (n *NIC) Close() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	// Shut all three gates before waiting on any, so that no new call
	// starts on one side while Close waits for another.
	first := n.txGate.Shut()
	n.rxGate.Shut()
	n.ctlGate.Shut()
	if !first {
		return nil
	}
	n.txGate.Drain()
	n.rxGate.Drain()
	n.ctlGate.Drain()
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	errs = append(errs, n.command(cmdQuiesce), n.command(cmdReset))
	// The device no longer reads the shared area; clear its address.
	errs = append(errs, n.vd.Store32(regDSAL, 0), n.vd.Store32(regDSAH, 0))
	if n.release != nil {
		errs = append(errs, n.release())
	}
	if err := errors.Join(errs...); err != nil {
		return n.opErr("close", err)
	}
	return nil
}

// closedOr returns err, or ErrClosed with err beside it when Close has
// begun (a sleeper woken by Close sees its vector closed, or its context's
// error: the NIC's state is the answer that matters).
func (n *NIC) closedOr(g *gate, err error) error {
	if g.IsShut() {
		return fmt.Errorf("%w (%w)", ErrClosed, err)
	}
	return err
}
