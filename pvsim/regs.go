package pvsim

import (
	"fmt"
	"syscall"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/vfio"
)

// The register file (BAR1, facts sheet §2): 256 bytes of 32-bit registers.
// As in QEMU, every store is kept (so each offset reads back what was
// written, past 0x24 too) and then acted on.
const (
	numRegs    = 64
	regVersion = firmware.RegVersion / 4
	regDSRLow  = firmware.RegDSRLow / 4
	regDSRHigh = firmware.RegDSRHigh / 4
	regCtl     = firmware.RegCtl / 4
	regRequest = firmware.RegRequest / 4
	regErr     = firmware.RegErr / 4
	regICR     = firmware.RegICR / 4
	regIMR     = firmware.RegIMR / 4
	regMACL    = firmware.RegMACL / 4
	regMACH    = firmware.RegMACH / 4
)

// statusUnsupported is ERR for a command the device does not know (QEMU:
// unknown or unimplemented; no response is written).
const statusUnsupported = 0xFFFF

// errnoStatus is ERR for a QEMU handler that failed with errno: its
// negative value as 32 bits.
func errnoStatus(e syscall.Errno) uint32 { return uint32(-int32(e)) }

func (d *Device) initRegs() {
	d.regs[regVersion].Store(d.s.reported)
	if d.s.qemu {
		// QEMU: ERR reads 0xFFFF until the first ACTIVATE; MAC registers
		// are plain storage initialised to 0.
		d.regs[regErr].Store(statusUnsupported)
		return
	}
	// A VMware device: ERR 0 and the MAC in MACL/MACH [unverified: Linux
	// reads neither before it activates; it takes the MAC from the paired
	// vmxnet3].
	m := d.s.MAC
	d.regs[regMACL].Store(uint32(m[0]) | uint32(m[1])<<8 | uint32(m[2])<<16 | uint32(m[3])<<24)
	d.regs[regMACH].Store(uint32(m[4]) | uint32(m[5])<<8)
}

// regsView is BAR1 as a Function maps it.
type regsView struct{ f *Function }

func regOK(off int) error {
	if off < 0 || off > 4*numRegs-4 || off%4 != 0 {
		return fmt.Errorf("pvsim: register offset %#x (want 0..%#x, 4-byte aligned): %w", off, 4*numRegs-4, vfio.ErrRange)
	}
	return nil
}

// Load32 reads a register. On a VMware device ICR is read-to-clear
// [unverified: Linux never writes it].
func (r regsView) Load32(off int) (uint32, error) {
	if err := r.f.check(); err != nil {
		return 0, err
	}
	if err := regOK(off); err != nil {
		return 0, err
	}
	d := r.f.d
	if off/4 == regICR && !d.s.qemu {
		return d.regs[regICR].Swap(0), nil
	}
	return d.regs[off/4].Load(), nil
}

// Store32 writes a register and acts on it: DSRHIGH loads the DSR, CTL
// activates or resets, REQUEST (0) runs the command in the command slot.
func (r regsView) Store32(off int, v uint32) error {
	if err := r.f.check(); err != nil {
		return err
	}
	if err := regOK(off); err != nil {
		return err
	}
	d := r.f.d
	i := off / 4
	switch i {
	case regVersion:
		if d.s.qemu { // QEMU keeps whatever is written; a VMware device's VERSION is read-only
			d.regs[i].Store(v)
		}
		return nil
	case regErr, regICR:
		if d.s.qemu {
			d.regs[i].Store(v)
		}
		return nil
	}
	d.regs[i].Store(v)
	switch i {
	case regDSRLow:
		// QEMU sets the address to the low half (the high half cleared);
		// DSRHIGH ORs in the high half and loads.
		d.regs[regDSRHigh].Store(0)
	case regDSRHigh:
		addr := uint64(d.regs[regDSRLow].Load()) | uint64(v)<<32
		return d.call(func() { d.loadDSR(addr) })
	case regCtl:
		return d.call(func() { d.control(v) })
	case regRequest:
		if v == 0 {
			return d.request()
		}
	}
	return nil
}

// Sizes of the DSR and the command slots (pvrdma_dev_api.h).
const (
	dsrSize  = firmware.DSRSize
	cmdSize  = firmware.CmdSlotSize
	respSize = firmware.RespSlotSize
)

// loadDSR maps the DSR at addr as the device does when DSRHIGH is written:
// the command and response slots, the async-event and CQ-notification
// rings, and then writes the capabilities. Anything it cannot map leaves
// the DSR unloaded and the capabilities unwritten (QEMU logs and returns).
func (d *Device) loadDSR(addr uint64) {
	w := &d.w
	w.dsrLoaded = false
	d.loaded.Store(false)
	b := d.dmaBytes(addr, dsrSize)
	if b == nil {
		return
	}
	cmd, resp := le.Uint64(b[16:]), le.Uint64(b[24:])
	if d.dmaBytes(cmd, cmdSize) == nil || d.dmaBytes(resp, respSize) == nil {
		return
	}
	async, ok := d.deviceRing("async ring", b[32:48], 8)
	if !ok {
		return
	}
	cqn, ok := d.deviceRing("CQ notification ring", b[48:64], 4)
	if !ok {
		return
	}
	if d.s.version >= VersionPPN64 {
		w.uarPFN = le.Uint64(b[64:])
	} else {
		w.uarPFN = uint64(le.Uint32(b[64:]))
	}
	if d.s.qemu {
		encodeQEMUCaps(b[firmware.CapsOffset:], &d.s.caps)
	} else {
		encodeCaps(b[firmware.CapsOffset:], &d.s.caps, d.s.version)
	}
	w.async, w.cqn = async, cqn
	w.dsrLoaded = true
	w.resp = resp
	d.cmdIOV.Store(cmd)
	d.loaded.Store(true)
}

// deviceRing reads a DSR ring's page info (num_pages, pdir_dma) and maps
// it: the first table's entry 0 is the state page (the ring state at
// offset 8), entries 1..num_pages-1 the data pages.
func (d *Device) deviceRing(name string, info []byte, elem uint32) (devRing, bool) {
	np := le.Uint32(info[0:])
	pdir := le.Uint64(info[8:])
	if np == 0 {
		return devRing{}, false
	}
	if np > firmware.MaxDeviceRingPages {
		if d.s.qemu {
			// 7.2.0-7.2.6 read past the page table (fixed in 7.2.7).
			d.hazard("DSR %s with %d pages: QEMU 7.2.0 reads past its page table", name, np)
		}
		return devRing{}, false
	}
	pages, err := d.pageList(pdir, int(np), true)
	if err != nil {
		if d.s.qemu {
			d.hazard("DSR %s: %v (QEMU maps it regardless and crashes when it touches it)", name, err)
		}
		return devRing{}, false
	}
	n := (np - 1) * pageSize / elem
	return devRing{state: pages[0] + 8, pages: pages[1:], n: n, elem: elem}, true
}

// control acts on a CTL write.
func (d *Device) control(v uint32) {
	w := &d.w
	switch v {
	case firmware.CtlActivate:
		w.activated = true
		d.regs[regErr].Store(0)
	case firmware.CtlUnquiesce:
		// QEMU: nothing, ERR unchanged. A VMware device resumes after a
		// link-down quiesce and reports 0 [inference from Linux's check].
		if !d.s.qemu {
			w.quiesced = false
			d.regs[regErr].Store(0)
		}
	case firmware.CtlReset:
		w.activated = false
		if d.s.qemu {
			// QEMU stops its completion thread and frees nothing.
			return
		}
		// A VMware device forgets everything [unverified: Linux resets
		// only at remove]; a fatal device comes back [unverified].
		d.resetAll()
		d.fatal.Store(false)
	}
}

// command is a REQUEST the device accepted: the command slot as it was
// written, and the fault it meets, if any.
type command struct {
	req   [cmdSize]byte
	fault CommandFault
	done  chan struct{} // closed when it has run (synchronous REQUEST)
}

// request handles a REQUEST write of 0.
func (d *Device) request() error {
	d.ctr.commands.Add(1)
	if !d.loaded.Load() {
		// QEMU 7.2.0 and 7.2.1 dereference a NULL DSR here
		// (CVE-2022-1050); 7.2.2+ answer ERR 0xFFFF and raise vector 0.
		if d.s.qemu {
			if err := d.call(func() { d.hazard("REQUEST before the DSR is loaded: QEMU 7.2.0/7.2.1 crash (CVE-2022-1050)") }); err != nil {
				return err
			}
		}
		d.regs[regErr].Store(statusUnsupported)
		d.interrupt(vecResponse)
		d.ctr.cmdErrors.Add(1)
		return nil
	}
	if d.fatal.Load() {
		d.regs[regErr].Store(errnoStatus(syscall.EIO))
		d.ctr.cmdErrors.Add(1)
		return nil
	}
	c := &command{}
	d.mem.mu.Lock()
	b := d.mem.bytes(d.cmdIOV.Load(), cmdSize)
	if b != nil {
		copy(c.req[:], b)
	}
	d.mem.mu.Unlock()
	if b == nil {
		d.ctr.dmaFaults.Add(1)
		d.ctr.cmdErrors.Add(1)
		d.regs[regErr].Store(statusUnsupported)
		return nil
	}
	code := le.Uint32(c.req[8:])
	c.fault = d.takeFault(firmware.Cmd(code))
	if c.fault.Status != 0 {
		// Refused at the door: ERR says so and nothing is answered (QEMU
		// raises vector 0 after every REQUEST all the same).
		d.regs[regErr].Store(c.fault.Status)
		d.ctr.cmdErrors.Add(1)
		if d.s.qemu {
			d.interrupt(vecResponse)
		}
		return nil
	}
	if !d.s.qemu {
		// A VMware device's ERR is whether it accepted the request
		// (realdevice.md §7): an unknown code is refused at once.
		if code >= firmware.NumCmds {
			d.regs[regErr].Store(statusUnsupported)
			d.ctr.cmdErrors.Add(1)
			return nil
		}
		d.regs[regErr].Store(0)
		if delay := d.s.CommandDelay; delay > 0 {
			return d.callAsync(func() {
				d.w.after(delay, func() { d.runCommand(c) })
			})
		}
	}
	c.done = make(chan struct{})
	if !d.push(event{kind: evCmd, cmd: c}) {
		return fmt.Errorf("%s: %w", d.s.Name, ErrClosed)
	}
	select {
	case <-c.done:
		return nil
	case <-d.done:
		select {
		case <-c.done:
			return nil
		default:
			return fmt.Errorf("%s: %w", d.s.Name, ErrClosed)
		}
	}
}

// runCommand executes an accepted command on the device goroutine: the
// response is written (with the request's cookie, the ack and the error
// byte), ERR set on QEMU, and vector 0 raised.
func (d *Device) runCommand(c *command) {
	defer func() {
		if c.done != nil {
			close(c.done)
		}
	}()
	if c.fault.Hang {
		if d.s.qemu {
			d.regs[regErr].Store(0)
		}
		return
	}
	if d.fatal.Load() {
		return // died while the command waited
	}
	code := firmware.Cmd(le.Uint32(c.req[8:]))
	var resp [respSize]byte
	ack := uint32(code) | firmware.RespFlag
	var errno syscall.Errno
	answered := true
	if c.fault.Errno != 0 {
		errno = c.fault.Errno
	} else {
		ack, errno, answered = d.exec(code, c.req[:], resp[:])
	}
	if errno != 0 {
		d.ctr.cmdErrors.Add(1)
	}
	if d.s.qemu {
		switch {
		case !answered:
			d.regs[regErr].Store(statusUnsupported)
		case errno != 0:
			d.regs[regErr].Store(errnoStatus(errno))
		default:
			d.regs[regErr].Store(0)
		}
	}
	if answered {
		copy(resp[0:8], c.req[0:8])
		le.PutUint32(resp[8:], ack)
		resp[12] = uint8(errno)
		if b := d.dmaBytes(d.w.resp, respSize); b != nil {
			copy(b, resp[:])
		}
	}
	if answered || d.s.qemu {
		d.interrupt(vecResponse)
	}
}
