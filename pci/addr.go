package pci

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
)

// PCI identifiers this driver cares about.
const (
	VendorVMware  = 0x15ad // VMware, Inc.
	DevicePVRDMA  = 0x0820 // paravirtual RDMA NIC (function 1 of its slot)
	DeviceVMXNET3 = 0x07b0 // vmxnet3 Ethernet (function 0 of the same slot)
)

// Addr is a PCI function address: domain (segment), bus, slot (device) and
// function, as in 0000:00:10.1.
type Addr struct {
	Domain    uint16
	Bus, Slot uint8 // Slot is 0..31
	Func      uint8 // 0..7
}

// ParseAddr parses "DDDD:BB:SS.F" or "BB:SS.F" (domain 0), in hexadecimal
// except for the function number, as sysfs and lspci print them.
func ParseAddr(s string) (Addr, error) {
	bad := func(why string) (Addr, error) {
		return Addr{}, fmt.Errorf("%w %q: %s (want DDDD:BB:SS.F, e.g. 0000:00:10.1)", ErrInvalidAddr, s, why)
	}
	rest, fn, ok := strings.Cut(s, ".")
	if !ok {
		return bad("no '.' before the function number")
	}
	parts := strings.Split(rest, ":")
	var a Addr
	switch len(parts) {
	case 2:
	case 3:
		d, err := parseHex(parts[0], 4, 16)
		if err != nil {
			return bad("domain: " + err.Error())
		}
		a.Domain = uint16(d)
		parts = parts[1:]
	default:
		return bad("want two or three ':'-separated fields")
	}
	b, err := parseHex(parts[0], 2, 8)
	if err != nil {
		return bad("bus: " + err.Error())
	}
	sl, err := parseHex(parts[1], 2, 8)
	if err != nil {
		return bad("slot: " + err.Error())
	}
	if sl > 0x1f {
		return bad("slot above 1f")
	}
	if len(fn) != 1 || fn[0] < '0' || fn[0] > '7' {
		return bad("function must be one digit 0-7")
	}
	a.Bus, a.Slot, a.Func = uint8(b), uint8(sl), fn[0]-'0'
	return a, nil
}

func parseHex(s string, maxDigits, bits int) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, fmt.Errorf("%q is not 1-%d hex digits", s, maxDigits)
	}
	v, err := strconv.ParseUint(s, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%q is not hexadecimal", s)
	}
	return v, nil
}

// String formats a as sysfs names the function: "0000:00:10.1".
func (a Addr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%d", a.Domain, a.Bus, a.Slot, a.Func)
}

// Compare orders addresses by domain, bus, slot, function; it returns -1, 0
// or +1 like cmp.Compare.
func (a Addr) Compare(b Addr) int {
	if c := cmp.Compare(a.Domain, b.Domain); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Bus, b.Bus); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Slot, b.Slot); c != 0 {
		return c
	}
	return cmp.Compare(a.Func, b.Func)
}
