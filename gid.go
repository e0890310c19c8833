package vfrdma

import (
	"context"
	"net/netip"
	"strconv"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/firmware"
)

// GID is a 16-byte RoCE global identifier in network byte order.
type GID [16]byte

// String returns the GID in IPv6 notation ("fe80::5054:ff:fe12:3456"),
// the form ParseGID reads back.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// ParseGID parses a GID written in IPv6 notation: String's form, or the
// full colon form the kernel's sysfs gids files show
// ("fe80:0000:0000:0000:5054:00ff:fe12:3456"). A RoCE v2 GID of an IPv4
// address is written IPv4-mapped ("::ffff:10.0.0.2"); bare IPv4 text, a
// zone ("%eth0") or anything else is refused with ErrInvalid.
func ParseGID(s string) (GID, error) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return GID{}, invalidf("GID %s is not IPv6 notation", quoteShort(s))
	case a.Is4():
		return GID{}, invalidf("GID %s is an IPv4 address: write it IPv4-mapped, ::ffff:%s", quoteShort(s), s)
	case a.Zone() != "":
		return GID{}, invalidf("GID %s has a zone: a GID has none", quoteShort(s))
	}
	return GID(a.As16()), nil
}

// MarshalText writes the GID as String does (encoding.TextMarshaler: JSON
// and other text encodings carry a GID as its IPv6 notation).
func (g GID) MarshalText() ([]byte, error) { return netip.AddrFrom16(g).AppendTo(nil), nil }

// UnmarshalText reads a GID as ParseGID does (encoding.TextUnmarshaler).
func (g *GID) UnmarshalText(b []byte) error {
	v, err := ParseGID(string(b))
	if err != nil {
		return err
	}
	*g = v
	return nil
}

// quoteShort quotes s for an error message, cut to 64 bytes: what it quotes
// may have come from the network.
func quoteShort(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}

// BindGID puts gid at index of the device's GID table (CREATE_BIND). The
// binding is undone by UnbindGID or Close.
func (d *Device) BindGID(ctx context.Context, index int, gid GID) error {
	if err := d.enter(); err != nil {
		return d.opErr("bind GID", err)
	}
	defer d.exit()
	if index < 0 || index >= int(d.caps.GIDTblLen) {
		return d.opErr("bind GID", invalidf("GID index %d: the table has %d entries", index, d.caps.GIDTblLen))
	}
	err := d.ch.CreateBind(ctx, firmware.CreateBindRequest{
		MTU: 1024, VLAN: 0xFFF, Index: uint32(index), GID: gid, GIDType: d.gidType(),
	})
	if err != nil {
		return d.opErr("bind GID", err)
	}
	d.mu.Lock()
	_, had := d.binds[uint32(index)]
	d.binds[uint32(index)] = gid
	d.gidSet.set(uint32(index), true)
	d.mu.Unlock()
	if !had {
		d.journal.add(kindBind, uint32(index))
	}
	return nil
}

// gidType is the GID type CREATE_BIND carries: the one the device speaks.
// A device reports RoCE v1 or RoCE v2 in caps.gid_types, never both
// (LoadDSR refuses both); QEMU reports v1.
func (d *Device) gidType() uint8 {
	if d.caps.GIDTypes == firmware.GIDTypeRoCEv2 {
		return firmware.GIDTypeRoCEv2
	}
	return firmware.GIDTypeRoCEv1
}

// RoCEv2 reports a device configured for RoCE v2 (UDP encapsulation); else
// it speaks RoCE v1.
func (d *Device) RoCEv2() bool { return d.gidType() == firmware.GIDTypeRoCEv2 }

// UnbindGID removes the GID at index (DESTROY_BIND).
func (d *Device) UnbindGID(ctx context.Context, index int) error {
	if err := d.enter(); err != nil {
		return d.opErr("unbind GID", err)
	}
	defer d.exit()
	if err := d.unbind(ctx, uint32(index)); err != nil {
		return d.opErr("unbind GID", err)
	}
	return nil
}

func (d *Device) unbind(ctx context.Context, index uint32) error {
	d.mu.Lock()
	gid, ok := d.binds[index]
	d.mu.Unlock()
	if !ok {
		return invalidf("GID index %d is not bound", index)
	}
	if err := d.ch.DestroyBind(ctx, firmware.DestroyBindRequest{Index: index, GID: gid}); err != nil {
		return err
	}
	d.mu.Lock()
	delete(d.binds, index)
	d.gidSet.set(index, false)
	d.mu.Unlock()
	d.journal.remove(kindBind, index)
	return nil
}

// GIDs returns the bound GIDs by index.
func (d *Device) GIDs() map[int]GID {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := make(map[int]GID, len(d.binds))
	for i, g := range d.binds {
		m[int(i)] = g
	}
	return m
}

// gidBits marks the bound GID indices for the post path.
type gidBits [4]atomic.Uint64

func (g *gidBits) set(i uint32, on bool) {
	if i >= 256 {
		return
	}
	w, b := &g[i/64], uint64(1)<<(i%64)
	for {
		old := w.Load()
		nw := old &^ b
		if on {
			nw = old | b
		}
		if w.CompareAndSwap(old, nw) {
			return
		}
	}
}

func (g *gidBits) has(i int) bool {
	return i >= 0 && i < 256 && g[i/64].Load()&(1<<(i%64)) != 0
}

func (d *Device) gidBound(i int) bool { return d.gidSet.has(i) }
