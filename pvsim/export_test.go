package pvsim

import "sync"

// Seams for the package's own tests, compiled only with them.

// Hold stops the device goroutine where it stands in its inbox, as a long
// pass over a full inbox does, until release is called or the device
// closes: what arrives meanwhile waits unread, and its timers come due
// unseen.
func (d *Device) Hold() (release func(), err error) {
	held, rel := make(chan struct{}), make(chan struct{})
	if !d.push(event{kind: evCall, fn: func() {
		close(held)
		select {
		case <-rel:
		case <-d.quit:
		}
	}}) {
		return nil, ErrClosed
	}
	select {
	case <-held:
	case <-d.done:
		return nil, ErrClosed
	}
	return sync.OnceFunc(func() { close(rel) }), nil
}

// Vectors returns the vectors enabled now (nil if none).
func (d *Device) Vectors() []*Vector {
	d.vmu.Lock()
	defer d.vmu.Unlock()
	return append([]*Vector(nil), d.vecs...)
}

// Fired returns how many times the vector has fired in all.
func (v *Vector) Fired() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.fired
}
