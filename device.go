package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/internal/lifecycle"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vmxnet3"
	"github.com/vfrdma/vfrdma/wq"
)

// VFIO region indices and interrupt layout of the device.
const (
	regionRegs = 1 // BAR1: registers
	regionUAR  = 2 // BAR2: doorbell pages
	numVectors = 3 // MSI-X: command response, async events, CQ notification
	vfioDriver = "vfio-pci"
)

// The control pages, one DMA buffer: the DSR, the command and response
// slots, and the two device rings (directory, table, state page, then the
// data: one page for the async ring, which QEMU never writes, and
// cqnDataPages for the CQ-notification ring, which QEMU writes for every
// CQE and stops notifying through once it is full).
const (
	pgDSR = iota
	pgCmd
	pgResp
	pgAsyncDir
	pgAsyncTable
	pgAsyncState
	pgAsyncData
	pgCQNDir
	pgCQNTable
	pgCQNState
	pgCQNData
	ctlPages = pgCQNData + cqnDataPages
)

// cqnDataPages sizes the CQ-notification ring: 8 pages of 4-byte entries,
// 8192 slots, a power of two.
const cqnDataPages = 8

// Caps are the device's capabilities as it reports them in the DSR.
type Caps = firmware.Caps

// Quirks are the deviations from the device interface the driver found.
type Quirks = firmware.Quirks

// Device is an open pvrdma function. It is safe for concurrent use, Close
// included, and follows the lifecycle rule (doc.go): after Close its
// methods return ErrClosed, and Close waits out the calls under way.
type Device struct {
	name string
	addr pci.Addr
	opt  Options
	log  *slog.Logger

	bus       *pci.Bus
	boundPrev map[pci.Addr]string // set when Open bound the group
	fn        hw.Function         // the function: VFIO's (Open) or another (OpenFunction)
	vdev      *vfio.Device        // the VFIO device under fn, when Open opened it
	ethDev    *vfio.Device        // function 0 of the slot, through the same group (on the cdev path: the same IOAS)
	eth       *vmxnet3.NIC        // its NIC, while open
	regs      hw.Registers
	uar       doorbell.Register // the UAR page (an *mmio.Region; the host tests intercept it)
	ctl       *vfio.DMABuffer
	vectors   []hw.Vector
	cqIRQ     irqWaiter // vector 2, what the notifier waits on
	ch        commands  // a *firmware.Channel once open
	cqNotify  *firmware.CQNotifyRing
	asyncRing *firmware.AsyncRing
	async     asyncEvents
	portState atomic.Uint32 // port 1's state: QUERY_PORT at Open, then the port events
	journal   journal

	version   uint32
	caps      Caps
	activated bool // this Open activated the device (else it was already active)
	gid       GID  // the default GID, bound at index 0
	recovered int  // leftover objects destroyed at Open

	// The lifecycle (doc.go): gate admits the control calls (commands,
	// object creation and Close), which Close waits out before it destroys
	// anything; closeDone is made by the first Close and closed once it
	// has released the device, closeEnd once it has run the AfterClose
	// functions too and returns.
	gate      lifecycle.Gate
	closeDone chan struct{}
	closeEnd  chan struct{}

	mu       sync.Mutex
	closed   bool
	pds      map[*PD]struct{}
	cqs      map[*CQ]struct{}
	mrs      map[*MR]struct{}
	qps      map[*QP]struct{}
	srqs     map[*SRQ]struct{}
	binds    map[uint32]GID
	lkeys    wq.Keys      // local key → MR region, for posting
	qpns     wq.Table[QP] // QP handle (masked) or alias → QP, for polling; a destroyed QP stays until its flush is drained
	gidSet   gidBits
	udMax    int    // UD payload limit: the port's active MTU
	aliasSeq uint32 // retireQPN's last alias
	notify   notifier
	// afterClose are the AfterClose functions by registration, run once
	// (afterRan) by Close.
	afterClose map[uint64]func()
	afterSeq   uint64
	afterRan   bool

	// Snapshots of the quirks the data path consults, fixed at Open.
	emulated bool
	waitSpin time.Duration // CQ.Wait's spin: Options.Spin, or its default for the device (0: none)
	pollPace time.Duration // the POLL doorbell's pace: Options.PollPace, or its default (0: none)
	// pollStopped is StopPollDoorbell's; pollRinging counts the empty
	// polls that may be ringing the POLL doorbell now.
	pollStopped atomic.Bool
	pollRinging atomic.Int64
	// The CQs armed in the device's sense with ArmBesidePollDoorbell
	// (cqwait.go: armBesidePoll, noneArmedOnDevice): no POLL doorbell rings while there is
	// one. nArmed is their count, read by empty polls without the lock.
	armedMu  sync.Mutex
	armedCQs []*CQ
	nArmed   atomic.Int32
	// drainSends: before it destroys a QP, wait for the device to have
	// completed the QP's sends and for its CQs to be quiet (QEMU 7.2, see
	// QP.awaitSends and QP.awaitQuietCQs).
	drainSends bool
	cqArm      [2]uint32 // CQ arm bits: [0] next completion, [1] solicited only
}

// Open takes the pvrdma function at bdf ("0000:00:10.1") through VFIO and
// brings the device up.
func Open(bdf string, opts *Options) (_ *Device, err error) {
	if err := opts.check(); err != nil {
		return nil, &OpError{Op: "open", Dev: bdf, Err: err}
	}
	o := opts.withDefaults()
	addr, err := pci.ParseAddr(bdf)
	if err != nil {
		return nil, &OpError{Op: "open", Dev: bdf, Err: err}
	}
	d := newDevice(addr.String(), o)
	d.addr = addr
	d.bus = pci.NewBus(o.SysfsRoot)
	defer func() {
		if err != nil {
			d.release()
			err = d.opErr("open", err)
		}
	}()
	if err := d.takeFunction(); err != nil {
		return nil, err
	}
	vdev, err := vfio.Open(d.addr, &vfio.Options{SysfsRoot: d.opt.SysfsRoot, Path: d.opt.VFIO})
	if err != nil {
		return nil, err
	}
	d.vdev = vdev
	d.fn = &vfioFunction{dev: vdev}
	if _, err := vdev.EnableBusMaster(); err != nil {
		return nil, err
	}
	return d, d.bringUp()
}

// OpenFunction brings up the pvrdma device behind fn, a function other
// than VFIO's: the device model (package pvsim) in tests, examples and
// tools. Options.SysfsRoot, BindGroup and Ethernet do not apply (there is
// no slot, so no vmxnet3 function); the journal is kept
// only where Options.StateDir names a directory. Close closes fn.
func OpenFunction(fn hw.Function, opts *Options) (_ *Device, err error) {
	if fn == nil {
		return nil, &OpError{Op: "open", Err: invalidf("no function")}
	}
	if err := opts.check(); err != nil {
		return nil, &OpError{Op: "open", Dev: fn.Name(), Err: err}
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.StateDir == "" {
		o.StateDir = "-"
	}
	o.Ethernet.Off = true
	d := newDevice(fn.Name(), o.withDefaults())
	d.fn = fn
	defer func() {
		if err != nil {
			d.release()
			err = d.opErr("open", err)
		}
	}()
	return d, d.bringUp()
}

func newDevice(name string, o Options) *Device {
	d := &Device{
		name: name, opt: o, log: o.Logger,
		pds:   map[*PD]struct{}{},
		cqs:   map[*CQ]struct{}{},
		mrs:   map[*MR]struct{}{},
		qps:   map[*QP]struct{}{},
		srqs:  map[*SRQ]struct{}{},
		binds: map[uint32]GID{},
	}
	d.notify.d = d
	d.journal.path = journalPath(o.StateDir, d.name)
	return d
}

// bringUp maps the function, loads the DSR, recovers a crashed holder's
// leftovers, activates the device, brings up the Ethernet function if there
// is one, binds the default GID and reads the port.
func (d *Device) bringUp() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*d.opt.CommandTimeout)
	defer cancel()
	if err := d.mapDevice(); err != nil {
		return err
	}
	if err := d.start(ctx); err != nil {
		return err
	}
	if err := d.recover(ctx); err != nil {
		return err
	}
	if err := d.activate(ctx); err != nil {
		return err
	}
	if !d.opt.Ethernet.Off && d.vdev != nil {
		if err := d.openEthernet(); err != nil {
			return err
		}
	}
	// The default GID: the link-local prefix and the node GUID, the
	// EUI-64 of the paired vmxnet3's MAC. Index 0 of the guest table.
	copy(d.gid[:2], []byte{0xfe, 0x80})
	binary.BigEndian.PutUint64(d.gid[8:], d.caps.NodeGUID)
	if err := d.BindGID(ctx, 0, d.gid); err != nil {
		return err
	}
	port, err := d.ch.QueryPort(ctx, 1)
	if err != nil {
		return err
	}
	d.udMax = 128 << min(max(port.ActiveMTU, 1), 5)
	d.portState.Store(port.State)
	d.startAsync()
	return nil
}

// openEthernet opens the slot's vmxnet3 function (function 0) through the
// group the pvrdma function opened (on the cdev path: through its own
// cdev, into the same iommufd and IOAS), and brings it up.
func (d *Device) openEthernet() error {
	fn0 := d.addr
	fn0.Func = 0
	dev, err := d.vdev.Group().OpenDevice(fn0.String())
	if err != nil {
		return fmt.Errorf("the slot's vmxnet3 function (Options.Ethernet.Off leaves it alone): %w", err)
	}
	d.ethDev = dev
	if d.eth, err = vmxnet3.Open(dev, &d.opt.Ethernet.NIC); err != nil {
		return err
	}
	return nil
}

// VFIOPath says how Open took the function: "cdev" (the device cdev and
// iommufd) or "group" (the IOMMU group and a type1 container); "" for a
// Device from OpenFunction, which has no VFIO.
func (d *Device) VFIOPath() string {
	if d.vdev == nil {
		return ""
	}
	return string(d.vdev.Path())
}

// Ethernet returns the slot's vmxnet3 NIC, or nil with Options.Ethernet.Off.
func (d *Device) Ethernet() *vmxnet3.NIC { return d.eth }

// takeFunction checks the function and, if asked, binds its group.
func (d *Device) takeFunction() error {
	f, err := d.bus.Lookup(d.addr)
	if err != nil {
		return err
	}
	if f.Vendor != pci.VendorVMware || f.Device != pci.DevicePVRDMA {
		return invalidf("%s is %04x:%04x, not a pvrdma function (%04x:%04x)", d.addr, f.Vendor, f.Device, pci.VendorVMware, pci.DevicePVRDMA)
	}
	if d.opt.BindGroup && f.Driver != vfioDriver {
		prev, err := d.bus.BindGroup(d.addr, vfioDriver)
		if err != nil {
			return err
		}
		d.boundPrev = prev
	}
	return nil
}

// mapDevice maps the registers and the first doorbell page, enables
// MSI-X, and allocates and lays out the control pages.
func (d *Device) mapDevice() error {
	var err error
	if d.regs, err = d.fn.Registers(); err != nil {
		return err
	}
	// Every UAR page is equivalent on QEMU and handles are global; the
	// driver uses page 0, the kernel driver's page on VMware hardware.
	if d.uar, err = d.fn.Doorbells(); err != nil {
		return err
	}
	if d.vectors, err = d.fn.EnableVectors(numVectors); err != nil {
		return err
	}
	if len(d.vectors) != numVectors {
		return fmt.Errorf("%d MSI-X vectors enabled, the driver needs %d", len(d.vectors), numVectors)
	}
	d.cqIRQ = d.vectors[firmware.VectorCQ]
	d.ctl, err = d.fn.AllocDMA(ctlPages*firmware.PageSize, false)
	if err != nil {
		return err
	}
	// Device rings: directory → table → state page, data page.
	for _, r := range []struct{ dir, table, state, data, pages int }{
		{pgAsyncDir, pgAsyncTable, pgAsyncState, pgAsyncData, 1},
		{pgCQNDir, pgCQNTable, pgCQNState, pgCQNData, cqnDataPages},
	} {
		var dma []uint64
		for i := range r.pages {
			dma = append(dma, d.ctlPage(r.data+i).DMA)
		}
		if err := firmware.WriteRingPageDir(d.ctlPage(r.dir), d.ctlPage(r.table), d.ctlPage(r.state).DMA, dma); err != nil {
			return err
		}
	}
	asyncState, err := mmio.New(d.ctlPage(pgAsyncState).Mem)
	if err != nil {
		return err
	}
	if d.asyncRing, err = firmware.NewAsyncRing(asyncState, [][]byte{d.ctlPage(pgAsyncData).Mem}); err != nil {
		return err
	}
	cqnState, err := mmio.New(d.ctlPage(pgCQNState).Mem)
	if err != nil {
		return err
	}
	var cqnData [][]byte
	for i := range cqnDataPages {
		cqnData = append(cqnData, d.ctlPage(pgCQNData+i).Mem)
	}
	if d.cqNotify, err = firmware.NewCQNotifyRing(cqnState, cqnData); err != nil {
		return err
	}
	return nil
}

func (d *Device) ctlPage(i int) firmware.Page { return bufPage(d.ctl, i) }

// A ring object's pages (CQ, QP, SRQ): the directory, its one table, the
// ring-state page, then the data pages. The device reads only the first
// table of such an object.
const (
	ringPgDir = iota
	ringPgTable
	ringPgState
	ringPgData
)

// allocRing allocates a ring object's pages, zeroed (so the ring counters
// start at 0; the device never initialises them), and writes its
// directory.
func (d *Device) allocRing(dataPages int) (*vfio.DMABuffer, error) {
	buf, err := d.fn.AllocDMA((ringPgData+dataPages)*firmware.PageSize, false)
	if err != nil {
		return nil, err
	}
	data := make([]uint64, dataPages)
	for i := range data {
		data[i] = bufPage(buf, ringPgData+i).DMA
	}
	if err := firmware.WriteRingPageDir(bufPage(buf, ringPgDir), bufPage(buf, ringPgTable), bufPage(buf, ringPgState).DMA, data); err != nil {
		buf.Close()
		return nil, err
	}
	return buf, nil
}

// bufPage returns page i of a DMA buffer: its device address and memory.
func bufPage(buf *vfio.DMABuffer, i int) firmware.Page {
	off := i * firmware.PageSize
	return firmware.Page{DMA: buf.IOVA + uint64(off), Mem: buf.Mem[off : off+firmware.PageSize]}
}

// start opens the command channel and loads the DSR (firmware.Channel.Start:
// the version checked, the DSR written, the capabilities validated), leaving
// the device inactive.
func (d *Device) start(ctx context.Context) error {
	vec0 := d.vectors[firmware.VectorResponse]
	ch, err := firmware.NewChannel(d.regs, d.ctlPage(pgCmd).Mem, d.ctlPage(pgResp).Mem, &firmware.Options{
		Device:  d.name,
		Timeout: d.opt.CommandTimeout,
		Wait: func(ctx context.Context) error {
			_, err := vec0.Wait(ctx)
			return err
		},
	})
	if err != nil {
		return err
	}
	d.ch = d.orderCommands(ch) // QP, CQ and SRQ CREATEs and DESTROYs placed among the async events
	dsrPage := d.ctlPage(pgDSR)
	var uarPFN uint64
	if l, ok := d.fn.(hw.UARLocator); ok {
		if uarPFN, err = l.UARPFN(); err != nil {
			return fmt.Errorf("the UAR page's address: %w", err)
		}
	}
	// Not activated here: recover destroys a crashed holder's leftovers
	// first, then activate unmasks and activates (once, on QEMU).
	version, caps, err := ch.Start(ctx, &firmware.StartConfig{
		DSR: firmware.DSR{
			GOS:         firmware.GOSInfo{Bits: firmware.GOSBits64, Type: firmware.GOSTypeLinux, Version: 1},
			CmdSlotDMA:  d.ctlPage(pgCmd).DMA,
			RespSlotDMA: d.ctlPage(pgResp).DMA,
			AsyncRing:   firmware.RingPageInfo{NumPages: 2, PDirDMA: d.ctlPage(pgAsyncDir).DMA},
			CQRing:      firmware.RingPageInfo{NumPages: 1 + cqnDataPages, PDirDMA: d.ctlPage(pgCQNDir).DMA},
			UARPFN:      uarPFN,
		},
		DSRMem:     dsrPage.Mem,
		DSRDMA:     dsrPage.DMA,
		NoActivate: true,
	})
	d.version = version
	if err != nil {
		return err
	}
	d.caps = caps
	q := ch.Quirks()
	d.emulated = q.Emulated
	d.drainSends = q.Emulated
	d.waitSpin = d.opt.Spin
	if d.waitSpin == 0 && !q.Emulated {
		d.waitSpin = DefaultSpin
	}
	d.waitSpin = max(d.waitSpin, 0)
	d.pollPace = d.opt.PollPace
	if d.pollPace == 0 && q.Emulated {
		d.pollPace = DefaultPollPace
	}
	d.pollPace = max(d.pollPace, 0)
	d.cqArm = [2]uint32{q.CQArm(false), q.CQArm(true)}
	return nil
}

// recover destroys what the journal says a previous holder of the function
// left on the device: its process died before its Close.
func (d *Device) recover(ctx context.Context) error {
	left, err := readJournal(d.journal.path)
	if err != nil {
		return err
	}
	d.recovered = destroyLeftovers(left, func(e journalEntry) error {
		var derr error
		switch e.Kind {
		case kindQP:
			derr = d.ch.DestroyQP(ctx, e.Handle)
		case kindSRQ:
			derr = d.ch.DestroySRQ(ctx, e.Handle)
		case kindCQ:
			derr = d.ch.DestroyCQ(ctx, e.Handle)
		case kindMR:
			derr = d.ch.DestroyMR(ctx, e.Handle)
		case kindPD:
			derr = d.ch.DestroyPD(ctx, e.Handle)
		case kindBind:
			derr = d.ch.DestroyBind(ctx, firmware.DestroyBindRequest{Index: e.Handle})
		default:
			derr = fmt.Errorf("unknown journal kind %q", e.Kind)
		}
		d.log.Debug("recovering leftover object", "kind", e.Kind, "handle", e.Handle, "err", derr)
		return derr
	})
	if len(left) > 0 {
		if err := os.Remove(d.journal.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// destroyLeftovers destroys the journal's leftovers in order and returns
// how many the device confirmed destroyed. A handle already gone answers
// an error (EINVAL): nothing is lost by going on, and nothing is counted.
func destroyLeftovers(left []journalEntry, destroy func(journalEntry) error) int {
	n := 0
	for _, e := range left {
		if destroy(e) == nil {
			n++
		}
	}
	return n
}

// activate unmasks interrupts and activates the device unless it is already
// active. On QEMU (Quirks.Emulated) ERR reads 0xFFFF until the first
// ACTIVATE and holds a command status after it; a second ACTIVATE only
// restarts the backend's completion thread, blocking the vCPU for seconds.
func (d *Device) activate(ctx context.Context) error {
	if err := d.ch.SetInterruptMask(ctx, firmware.IMRUnmaskAll); err != nil {
		return err
	}
	errReg, err := d.regs.Load32(firmware.RegErr)
	if err != nil {
		return err
	}
	if d.emulated && errReg != 0xFFFF && !d.opt.ForceActivate {
		d.log.Debug("device already active; not activating again", "err_reg", errReg)
		return nil
	}
	if err := d.ch.Activate(ctx); err != nil {
		return err
	}
	d.activated = true
	return nil
}

// Name returns the device's PCI address.
func (d *Device) Name() string { return d.name }

// Version returns the device interface version (VERSION register).
func (d *Device) Version() uint32 { return d.version }

// Caps returns the device's capabilities.
func (d *Device) Caps() Caps { return d.caps }

// Quirks returns what the driver works around on this device.
func (d *Device) Quirks() Quirks { return d.ch.Quirks() }

// GID returns the default GID, bound at index 0.
func (d *Device) GID() GID { return d.gid }

// UDMaxPayload returns the largest UD message: the port's path MTU.
func (d *Device) UDMaxPayload() int { return d.udMax }

// Recovered returns how many objects a crashed earlier holder of the
// function left on the device and Open destroyed: those whose DESTROY the
// device confirmed. A journal entry the device no longer knew (it answered
// the DESTROY with an error) is not counted.
func (d *Device) Recovered() int { return d.recovered }

// closeObject runs an object's destroy with the command timeout, for its
// Close. Once Device.Close has begun, the Device destroys the object
// itself: closeObject waits for it to finish and returns nil.
func (d *Device) closeObject(op string, destroy func(context.Context) error) error {
	if !d.gate.Enter() {
		d.waitClosed()
		return nil
	}
	defer d.gate.Exit()
	ctx, cancel := context.WithTimeout(context.Background(), d.opt.CommandTimeout)
	defer cancel()
	return d.opErr(op, destroy(ctx))
}

// enter admits a control call (a command, an object's creation); it must
// exit. After Close has begun it returns ErrClosed.
func (d *Device) enter() error {
	if !d.gate.Enter() {
		return fmt.Errorf("%w: device %s", ErrClosed, d.name)
	}
	return nil
}

func (d *Device) exit() { d.gate.Exit() }

// waitClosed waits for the Close under way, if any, to return.
func (d *Device) waitClosed() {
	d.mu.Lock()
	done := d.closeDone
	d.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Close destroys every object the Device created (QPs, SRQs, CQs, MRs, PDs,
// in that order), unbinds its GIDs, quiesces the device and
// releases the interrupts, DMA memory, mappings and VFIO handles, then gives
// the group back if Open bound it.
//
// It follows the lifecycle rule (doc.go): it first refuses new calls and
// waits for the control calls under way (an object created meanwhile is
// destroyed with the rest); each object's queues are shut and their calls
// waited out before its memory goes, whether or not the device confirmed
// its destruction; waiters (CQ.Wait, wait sets, poll sets, counters) are
// woken and return ErrClosed. It is idempotent: a second call waits for
// the first and returns nil. Last, it runs the AfterClose functions.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closeDone != nil {
		end := d.closeEnd
		d.mu.Unlock()
		<-end
		return nil
	}
	done, end := make(chan struct{}), make(chan struct{})
	d.closeDone, d.closeEnd = done, end
	d.mu.Unlock()
	// In reverse: the objects' Closes waiting for this one return, then
	// the AfterClose functions run (they may close objects), then a
	// second Close returns.
	defer close(end)
	defer d.runAfterClose()
	defer close(done)

	d.gate.Close() // control calls under way finish; later ones get ErrClosed
	d.mu.Lock()
	d.closed = true
	qps := mapKeys(d.qps)
	srqs := mapKeys(d.srqs)
	cqs := mapKeys(d.cqs)
	mrs := mapKeys(d.mrs)
	pds := mapKeys(d.pds)
	binds := mapKeys(d.binds)
	d.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 4*d.opt.CommandTimeout)
	defer cancel()
	// Users before what they use: QPs, SRQs, CQs, MRs, PDs, then the GIDs.
	// Posts to the SRQs stop first: the QPs' destruction takes them off
	// their SRQ, and a post racing it must see ErrClosed, not "no QP uses
	// the SRQ".
	for _, s := range srqs {
		s.q.StopPosts()
	}
	var errs []error
	for _, qp := range qps {
		errs = append(errs, qp.destroy(ctx))
	}
	for _, s := range srqs {
		errs = append(errs, s.destroy(ctx))
	}
	for _, cq := range cqs {
		errs = append(errs, cq.destroy(ctx, true))
	}
	for _, mr := range mrs {
		errs = append(errs, mr.destroy(ctx))
	}
	for _, pd := range pds {
		errs = append(errs, pd.destroy(ctx))
	}
	for _, i := range binds {
		errs = append(errs, d.unbind(ctx, i))
	}
	// What the device would not destroy is shut all the same: its calls
	// are refused and waited out before release unmaps what they touch.
	for _, qp := range qps {
		qp.shut()
	}
	for _, s := range srqs {
		s.shut()
	}
	for _, cq := range cqs {
		cq.shut()
	}
	errs = append(errs, d.quiesce(ctx))
	d.stopAsync()
	d.notify.stop()
	errs = append(errs, d.release())
	return d.opErr("close", errors.Join(errs...))
}

// AfterClose arranges for f to run once Close has released the device
// (every object destroyed or shut, the interrupts, rings and IOMMU
// mappings gone), whatever Close returns: on Close's goroutine, before
// Close returns, in the order registered. Memory the device may reach
// while it is open (that of an MR whose deregistration the device
// refused) is safe to free there. If Close has run them already, f runs
// at once on a goroutine of its own. Calling stop unregisters f; it
// reports whether that stopped f from running (false: f has run or is
// running), as context.AfterFunc's stop does.
func (d *Device) AfterClose(f func()) (stop func() bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.afterRan {
		go f()
		return func() bool { return false }
	}
	if d.afterClose == nil {
		d.afterClose = map[uint64]func(){}
	}
	d.afterSeq++
	key := d.afterSeq
	d.afterClose[key] = f
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := d.afterClose[key]
		delete(d.afterClose, key)
		return ok
	}
}

// runAfterClose runs the AfterClose functions, once.
func (d *Device) runAfterClose() {
	d.mu.Lock()
	fs := d.afterClose
	d.afterClose, d.afterRan = nil, true
	d.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(fs)) {
		fs[k]()
	}
}

// quiesce masks the device's interrupts. On devices other than QEMU it also
// resets the device, as Linux does on remove; QEMU's reset frees nothing and
// blocks the vCPU for seconds while it stops its completion thread.
func (d *Device) quiesce(ctx context.Context) error {
	if d.ch == nil {
		return nil
	}
	err := d.ch.SetInterruptMask(ctx, firmware.IMRMaskAll)
	if !d.emulated {
		err = errors.Join(err, d.ch.Reset(ctx))
	}
	return err
}

// release undoes what Open set up, in reverse order; it runs on Open's
// error paths too, with whatever was set up.
func (d *Device) release() error {
	var errs []error
	// The Ethernet function first: its memory is in the pvrdma device's
	// container, which the pvrdma device's Close closes.
	if d.eth != nil {
		errs = append(errs, d.eth.Close())
	}
	if d.ethDev != nil {
		errs = append(errs, d.ethDev.Close())
	}
	if d.ch != nil {
		errs = append(errs, d.ch.Close())
	}
	if d.ctl != nil {
		errs = append(errs, d.ctl.Close())
	}
	if d.fn != nil {
		errs = append(errs, d.fn.Close()) // disables the vectors, unmaps the BARs, closes VFIO's handles
	}
	if d.boundPrev != nil {
		errs = append(errs, d.bus.RestoreGroup(d.boundPrev))
	}
	d.journal.mu.Lock()
	errs = append(errs, d.journal.err)
	d.journal.mu.Unlock()
	return errors.Join(errs...)
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
