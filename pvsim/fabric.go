package pvsim

import (
	"sync"
	"sync/atomic"
)

// Fabric connects model devices: a packet goes to the device that has its
// destination GID bound (CREATE_BIND), as a RoCE network routes by GID. It
// is lossless (unless told to lose answers, LoseAnswers) and keeps each
// sender's order. A Fabric is safe for concurrent use. One from NewFabric
// joins the devices of one process: it has no goroutines and needs no
// closing; one from JoinFabric also reaches the devices of the other
// processes that joined its directory (fabricdir.go), and Close leaves it.
type Fabric struct {
	mu   sync.RWMutex
	gids map[[16]byte]*Device
	devs map[*Device]struct{}

	lose atomic.Int64 // answers still to lose
	net  *fabricNet   // JoinFabric's; nil for one process
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{gids: map[[16]byte]*Device{}, devs: map[*Device]struct{}{}}
}

func (f *Fabric) attach(d *Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devs[d] = struct{}{}
}

func (f *Fabric) detach(d *Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.devs, d)
	for g, o := range f.gids {
		if o == d {
			delete(f.gids, g)
			if f.net != nil {
				f.net.unpublish(g)
			}
		}
	}
}

// bind makes g reach d (the last device to bind a GID gets its traffic).
func (f *Fabric) bind(g [16]byte, d *Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.devs[d]; ok {
		f.gids[g] = d
		if f.net != nil {
			f.net.publish(g)
		}
	}
}

func (f *Fabric) unbind(g [16]byte, d *Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gids[g] == d {
		delete(f.gids, g)
		if f.net != nil {
			f.net.unpublish(g)
		}
	}
}

// Lookup returns the device that has GID g bound, or nil.
func (f *Fabric) Lookup(g [16]byte) *Device {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.gids[g]
}

// deliver queues p on the device that has its destination GID, in this
// process or, on a fabric across processes, in the one the directory
// names; false if none does.
func (f *Fabric) deliver(p *packet) bool {
	if t := f.Lookup(p.dstGID); t != nil {
		return t.push(event{kind: evPacket, pkt: p})
	}
	if f.net != nil {
		if r := f.net.route(p.dstGID); r != nil {
			return r.push(event{kind: evPacket, pkt: p})
		}
	}
	return false
}
