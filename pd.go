package vfrdma

import (
	"context"
	"fmt"
	"sync"
)

// PD is a protection domain. Its methods are safe for concurrent use. It
// follows the lifecycle rule (doc.go): after Close, creating anything in
// it returns ErrClosed; a creation racing Close holds the PD while it runs,
// so that Close returns ErrBusy or the creation ErrClosed.
type PD struct {
	d      *Device
	handle uint32

	mu     sync.Mutex
	closed bool
	users  int // MRs and QPs of this PD still open
}

// enter admits a creation in the PD (the Device's control gate, and the
// PD held meanwhile); it must exit.
func (pd *PD) enter() error {
	if err := pd.d.enter(); err != nil {
		return err
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		pd.d.exit()
		return fmt.Errorf("%w: PD %d", ErrClosed, pd.handle)
	}
	pd.users++
	return nil
}

func (pd *PD) exit() {
	pd.hold(-1)
	pd.d.exit()
}

// hold counts an MR or QP of the PD in (+1) or out (-1).
func (pd *PD) hold(n int) {
	pd.mu.Lock()
	pd.users += n
	pd.mu.Unlock()
}

// AllocPD creates a protection domain (CREATE_PD).
func (d *Device) AllocPD(ctx context.Context) (*PD, error) {
	if err := d.enter(); err != nil {
		return nil, d.opErr("create PD", err)
	}
	defer d.exit() // Close waits for the PD to be registered, then destroys it
	h, err := d.ch.CreatePD(ctx, 0)
	if err != nil {
		return nil, d.opErr("create PD", err)
	}
	pd := &PD{d: d, handle: h}
	d.journal.add(kindPD, h)
	d.mu.Lock()
	d.pds[pd] = struct{}{}
	d.mu.Unlock()
	return pd, nil
}

// Handle returns the device's handle of the PD.
func (pd *PD) Handle() uint32 { return pd.handle }

// Close destroys the PD. It is idempotent. A PD whose MRs or QPs are still
// open is not destroyed: that is ErrBusy.
func (pd *PD) Close() error {
	return pd.d.closeObject("destroy PD", pd.destroy)
}

func (pd *PD) destroy(ctx context.Context) error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if pd.users > 0 {
		return fmt.Errorf("%w: the PD still has %d MRs and QPs; close them first", ErrBusy, pd.users)
	}
	if err := pd.d.ch.DestroyPD(ctx, pd.handle); err != nil {
		return err
	}
	pd.closed = true
	pd.d.journal.remove(kindPD, pd.handle)
	pd.d.mu.Lock()
	delete(pd.d.pds, pd)
	pd.d.mu.Unlock()
	return nil
}
