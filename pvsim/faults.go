package pvsim

import (
	"fmt"
	"syscall"

	"github.com/vfrdma/vfrdma/firmware"
)

// Faults on demand: commands that meet an injected fault (never answered,
// answered with an error, refused) and answers the fabric loses. They are
// the model's fault-injection API, for a driver's tests and soaks.

// CommandFault is a fault the next matching commands meet (InjectFault).
type CommandFault struct {
	// Cmd is the command code it hits; AnyCommand hits every command.
	Cmd firmware.Cmd
	// Hang accepts the command and never answers it: no response, no
	// interrupt (a driver waits until its timeout).
	Hang bool
	// Errno answers the command, unexecuted, with this error: the
	// response's error byte, and on QEMU ERR = -Errno as well.
	Errno syscall.Errno
	// Status refuses the command at the REQUEST write: ERR reads Status,
	// nothing is executed or answered.
	Status uint32
	// Count is how many commands it hits: 0 means one, negative means
	// every one until ClearFaults.
	Count int
}

// AnyCommand makes a CommandFault hit every command code.
const AnyCommand = firmware.Cmd(0xFFFFFFFF)

// InjectFault makes the next commands matching f meet it. Faults are
// matched in the order they were injected.
func (d *Device) InjectFault(f CommandFault) error {
	n := 0
	for _, set := range []bool{f.Hang, f.Errno != 0, f.Status != 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("pvsim: a command fault is one of Hang, Errno and Status (%d set)", n)
	}
	if f.Count == 0 {
		f.Count = 1
	}
	d.fmu.Lock()
	d.faults = append(d.faults, f)
	d.fmu.Unlock()
	return nil
}

// ClearFaults removes every injected command fault.
func (d *Device) ClearFaults() {
	d.fmu.Lock()
	d.faults = nil
	d.fmu.Unlock()
}

func (d *Device) takeFault(code firmware.Cmd) CommandFault {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	for i := range d.faults {
		f := &d.faults[i]
		if f.Cmd != AnyCommand && f.Cmd != code {
			continue
		}
		out := *f
		if f.Count > 0 {
			if f.Count--; f.Count == 0 {
				d.faults = append(d.faults[:i], d.faults[i+1:]...)
			}
		}
		return out
	}
	return CommandFault{}
}

// LoseAnswers makes the fabric lose the next n answers any device sends
// (acknowledgements, NAKs, READ and atomic responses), as a lossy link
// would, so the requesters' retry timers have to recover them: a fault
// for tests of a driver's recovery from lost answers (the requester's
// retransmissions, the responder's duplicates); n <= 0 stops losing.
func (f *Fabric) LoseAnswers(n int) { f.lose.Store(int64(max(n, 0))) }

// loseAnswer reports whether the answer being sent is to be lost.
func (f *Fabric) loseAnswer() bool {
	for {
		n := f.lose.Load()
		if n <= 0 {
			return false
		}
		if f.lose.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
