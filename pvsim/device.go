package pvsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/vfio"
)

// ErrClosed reports use of a closed Device, Function or Vector. It wraps
// vfio.ErrClosed, as the VFIO function's errors do.
var ErrClosed = fmt.Errorf("pvsim: %w", vfio.ErrClosed)

// ErrNotSupported reports a request the modelled device does not take: an
// async event on QEMU 7.2, which raises none.
var ErrNotSupported = errors.New("pvsim: not supported by the modelled device")

// Device is one model of the PVRDMA function. It implements hw.Function
// (its Close closes the model); Function gives more handles on it, as
// reopening a VFIO device does. Its methods are safe for concurrent use.
//
// The device runs on one goroutine of its own, which executes commands,
// consumes work requests, moves data and writes completions, in the order
// their triggers arrive. Doorbell writes only queue work for it and never
// block; a write of REQUEST waits for its command on a QEMU device or a
// VMware device without CommandDelay, as QEMU's MMIO write does; the
// events on demand (Raise, SetPort, Fatal, OverflowCQ, ErrorQP) and the
// views of objects, logs and state (QP, QPs, SRQ, MRs, Objects, GIDs,
// Events, Hazards, State) wait for the device goroutine too (after Close
// the events return ErrClosed and the views empty results). Stats and DMA
// read counts without waiting; InjectFault and ClearFaults only change
// what later commands meet.
type Device struct {
	s   *settings
	fab *Fabric
	mem memory
	fn  *Function // the Device's own handle

	regs   [numRegs]atomic.Uint32
	loaded atomic.Bool   // the DSR is loaded (REQUEST may run)
	cmdIOV atomic.Uint64 // the command slot's device address
	fatal  atomic.Bool

	fmu    sync.Mutex // guards faults
	faults []CommandFault

	vmu      sync.Mutex
	vecs     []*Vector
	vecOwner *Function

	imu     sync.Mutex
	inbox   []event
	spare   []event
	stopped bool
	wake    chan struct{}
	quit    chan struct{}
	done    chan struct{}

	closeOnce sync.Once
	closeErr  error

	ctr counters
	w   worker
}

// New starts a model device.
func New(cfg Config) (*Device, error) {
	s, err := cfg.settle()
	if err != nil {
		return nil, err
	}
	d := &Device{
		s:    s,
		fab:  s.Fabric,
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	if d.fab == nil {
		d.fab = NewFabric()
	}
	d.fn = &Function{d: d, own: true}
	d.w = worker{
		rng:    rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15)),
		portUp: !s.PortDown,
		pds:    map[uint32]*pd{}, mrs: map[uint32]*mr{}, lkeys: map[uint32]*mr{}, rkeys: map[uint32]*mr{},
		cqs: map[uint32]*cq{}, qps: map[uint32]*qp{}, qpns: map[uint32]*qp{},
		srqs: map[uint32]*srq{}, ucs: map[uint32]bool{},
		gids: make([]gidEntry, s.caps.GIDTblLen),
	}
	d.initRegs()
	d.fab.attach(d)
	go d.run()
	return d, nil
}

// Name returns the function's name.
func (d *Device) Name() string { return d.s.Name }

// Config returns the configuration with its defaults filled in.
func (d *Device) Config() Config { return d.s.Config }

// Version returns the interface version the device reports.
func (d *Device) Version() uint32 { return d.s.reported }

// QEMU reports whether the model plays QEMU 7.2.
func (d *Device) QEMU() bool { return d.s.qemu }

// MAC returns the paired Ethernet function's MAC address.
func (d *Device) MAC() [6]byte { return d.s.MAC }

// DefaultGID returns the GID a driver derives from the node GUID (and
// vfrdma binds at index 0).
func (d *Device) DefaultGID() [16]byte { return DefaultGID(d.s.MAC) }

// Caps returns the capabilities the device reports.
func (d *Device) Caps() firmware.Caps { return d.s.caps }

// Registers maps BAR1 (hw.Function).
func (d *Device) Registers() (hw.Registers, error) { return d.fn.Registers() }

// Doorbells maps the first UAR page (hw.Function).
func (d *Device) Doorbells() (hw.Doorbells, error) { return d.fn.Doorbells() }

// EnableVectors enables MSI-X vectors (hw.Function).
func (d *Device) EnableVectors(n int) ([]hw.Vector, error) { return d.fn.EnableVectors(n) }

// AllocDMA allocates DMA memory (hw.Function).
func (d *Device) AllocDMA(size int, huge bool) (*vfio.DMABuffer, error) {
	return d.fn.AllocDMA(size, huge)
}

// UARPFN returns the first UAR page's frame number (hw.UARLocator).
func (d *Device) UARPFN() (uint64, error) { return d.fn.UARPFN() }

// MapDMA maps the caller's memory (hw.Function).
func (d *Device) MapDMA(mem []byte) (uint64, error) { return d.fn.MapDMA(mem) }

// UnmapDMA undoes MapDMA (hw.Function).
func (d *Device) UnmapDMA(iova uint64, size int) error { return d.fn.UnmapDMA(iova, size) }

// Function returns a new handle on the device: a hw.Function whose Close
// releases what was allocated, mapped and enabled through it, and leaves
// the device (its objects, its GIDs) running, as a process's exit leaves a
// real device. Use it to open the device again after a driver closed (or
// abandoned) it. Device.Close closes every handle.
func (d *Device) Function() *Function { return &Function{d: d} }

// Close stops the device: its goroutine ends, it leaves its fabric, its
// vectors are disabled, and every DMA buffer allocated through any handle
// is freed (close the driver first: its rings live there). It is
// idempotent.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.fn.closed.Store(true)
		d.imu.Lock()
		d.stopped = true
		d.imu.Unlock()
		close(d.quit)
		<-d.done
		d.discardInbox()
		d.fab.detach(d)
		d.disableVectors(nil)
		d.closeErr = d.mem.releaseOwned(nil)
	})
	return d.closeErr
}

// Function is a handle on a Device: what a driver opens. It implements
// hw.Function and is safe for concurrent use.
type Function struct {
	d      *Device
	own    bool // the Device's own handle: closing it closes the Device
	closed atomic.Bool
}

var (
	_ hw.Function   = (*Function)(nil)
	_ hw.Function   = (*Device)(nil)
	_ hw.UARLocator = (*Function)(nil)
	_ hw.UARLocator = (*Device)(nil)
)

// UARPFN returns the page frame number of the first UAR page
// (Config.UARAddress >> 12), which a driver writes into the DSR
// (hw.UARLocator). The device records what the DSR says (State.UARPFN).
func (f *Function) UARPFN() (uint64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	return f.d.s.UARAddress / pageSize, nil
}

func (f *Function) check() error {
	if f.closed.Load() {
		return fmt.Errorf("%s: %w", f.d.s.Name, ErrClosed)
	}
	return nil
}

// Name returns the device's name.
func (f *Function) Name() string { return f.d.s.Name }

// Registers returns BAR1, the register file: 256 bytes of 32-bit
// registers. Accesses after Close fail with ErrClosed.
func (f *Function) Registers() (hw.Registers, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return regsView{f}, nil
}

// Doorbells returns the first UAR page of BAR2. Stores after Close fail
// with ErrClosed.
func (f *Function) Doorbells() (hw.Doorbells, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return uarView{f}, nil
}

// EnableVectors enables 1 to 3 MSI-X vectors (command response, async
// events, CQ notification) and returns them. Vectors enabled earlier, by
// this handle or another, are disabled (their waiters return ErrClosed).
func (f *Function) EnableVectors(n int) ([]hw.Vector, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	if n < 1 || n > numVectors {
		return nil, fmt.Errorf("pvsim: %d MSI-X vectors: the device has %d: %w", n, numVectors, vfio.ErrRange)
	}
	d := f.d
	d.vmu.Lock()
	defer d.vmu.Unlock()
	for _, v := range d.vecs {
		v.close()
	}
	d.vecs = make([]*Vector, n)
	out := make([]hw.Vector, n)
	for i := range d.vecs {
		d.vecs[i] = &Vector{index: i, ch: make(chan struct{}, 1), name: d.s.Name}
		out[i] = d.vecs[i]
	}
	d.vecOwner = f
	return out, nil
}

// AllocDMA allocates size bytes (rounded up to pages) of zeroed memory off
// the Go heap, mapped in the model's IOMMU at a fresh device address. huge
// is ignored: the model maps 4 KiB pages.
func (f *Function) AllocDMA(size int, huge bool) (*vfio.DMABuffer, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.d.mem.allocDMA(f, size)
}

// MapDMA maps the caller's memory (page-aligned, whole pages) in the
// model's IOMMU and returns its device address.
func (f *Function) MapDMA(mem []byte) (uint64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	return f.d.mem.mapDMA(f, mem)
}

// UnmapDMA removes a mapping MapDMA made. Once it returns, the device no
// longer touches the memory.
func (f *Function) UnmapDMA(iova uint64, size int) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.d.mem.unmapDMA(iova, size)
}

// Close disables the vectors this handle enabled and releases the DMA
// memory allocated or mapped through it; the Device's own handle closes
// the Device. It is idempotent.
func (f *Function) Close() error {
	if f.own {
		return f.d.Close()
	}
	if f.closed.Swap(true) {
		return nil
	}
	f.d.disableVectors(f)
	return f.d.mem.releaseOwned(f)
}

// disableVectors closes the vectors if owner enabled them (nil: whoever
// did).
func (d *Device) disableVectors(owner *Function) {
	d.vmu.Lock()
	defer d.vmu.Unlock()
	if owner != nil && d.vecOwner != owner {
		return
	}
	for _, v := range d.vecs {
		v.close()
	}
	d.vecs, d.vecOwner = nil, nil
}

// MSI-X vectors of the device.
const (
	numVectors  = 3
	vecResponse = firmware.VectorResponse
	vecAsync    = firmware.VectorAsync
	vecCQ       = firmware.VectorCQ
)

// Vector is one of the device's MSI-X vectors (hw.Vector).
type Vector struct {
	index  int
	name   string
	mu     sync.Mutex
	count  uint64
	fired  uint64
	closed bool
	ch     chan struct{} // holds a token while count > 0; closed by close
}

// Wait blocks until the vector has fired since the last Wait, or ctx is
// done, and returns how many times it fired.
func (v *Vector) Wait(ctx context.Context) (uint64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		v.mu.Lock()
		n, closed := v.count, v.closed
		v.count = 0
		v.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		if closed {
			return 0, fmt.Errorf("%s: MSI-X vector %d: %w", v.name, v.index, ErrClosed)
		}
		select {
		case <-v.ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (v *Vector) fire() {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.count++
	v.fired++
	v.mu.Unlock()
	select {
	case v.ch <- struct{}{}:
	default:
	}
}

func (v *Vector) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.closed {
		v.closed = true
		close(v.ch)
	}
}

// interrupt raises vector vec, unless IMR masks it: on QEMU any non-zero
// IMR masks every vector and the interrupt is dropped; on a VMware device
// IMR bit vec masks vector vec (the cause bits, 1 << vector) and the
// interrupt is dropped too (whether the real device latches it is not
// known). A VMware device also sets the cause bit in ICR.
func (d *Device) interrupt(vec int) {
	imr := d.regs[regIMR].Load()
	if d.s.qemu && imr != 0 || !d.s.qemu && imr&(1<<vec) != 0 {
		d.ctr.masked.Add(1)
		return
	}
	if !d.s.qemu {
		d.regs[regICR].Or(1 << vec)
	}
	d.ctr.interrupts[vec].Add(1)
	d.vmu.Lock()
	var v *Vector
	if vec < len(d.vecs) {
		v = d.vecs[vec]
	}
	d.vmu.Unlock()
	if v != nil {
		v.fire()
	}
}

// hazard records something QEMU 7.2.0 would crash, hang or corrupt memory
// on (QEMU mode; see Hazards).
func (d *Device) hazard(format string, args ...any) {
	d.ctr.hazards.Add(1)
	if len(d.w.hazards) < maxLog {
		d.w.hazards = append(d.w.hazards, fmt.Sprintf(format, args...))
	}
}
