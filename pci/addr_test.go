package pci_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/vfrdma/vfrdma/pci"
)

func TestParseAddr(t *testing.T) {
	good := []struct {
		in   string
		want pci.Addr
		str  string
	}{
		{"0000:00:10.1", pci.Addr{Slot: 0x10, Func: 1}, "0000:00:10.1"},
		{"00:10.1", pci.Addr{Slot: 0x10, Func: 1}, "0000:00:10.1"},
		{"ffff:ff:1f.7", pci.Addr{Domain: 0xffff, Bus: 0xff, Slot: 0x1f, Func: 7}, "ffff:ff:1f.7"},
		{"0001:3B:00.0", pci.Addr{Domain: 1, Bus: 0x3b}, "0001:3b:00.0"},
		{"0:0:0.0", pci.Addr{}, "0000:00:00.0"},
	}
	for _, c := range good {
		a, err := pci.ParseAddr(c.in)
		if err != nil || a != c.want {
			t.Errorf("ParseAddr(%q) = %+v, %v; want %+v", c.in, a, err, c.want)
			continue
		}
		if a.String() != c.str {
			t.Errorf("%+v.String() = %q, want %q", a, a.String(), c.str)
		}
	}
	bad := []string{"", "00:10", "0000:00:10", "00:20.0", "00:10.8", "00:10.", "00:10.11",
		"10000:00:00.0", "000:00:00:00.0", "0000:100:00.0", "x0:00.0", "00:0g.0", "00:10.-1", "0000:00:10.1 "}
	for _, s := range bad {
		if a, err := pci.ParseAddr(s); !errors.Is(err, pci.ErrInvalidAddr) {
			t.Errorf("ParseAddr(%q) = %+v, %v; want ErrInvalidAddr", s, a, err)
		}
	}
}

func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"0000:00:10.1", "00:10.1", "ffff:ff:1f.7", "::.", "0:0:0.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := pci.ParseAddr(s)
		if err != nil {
			return
		}
		b, err := pci.ParseAddr(a.String())
		if err != nil || b != a {
			t.Fatalf("round trip of %q: %q -> %+v, %v", s, a.String(), b, err)
		}
	})
}

func TestCompare(t *testing.T) {
	as := []pci.Addr{{Func: 1}, {Domain: 1}, {Bus: 1}, {Slot: 1}, {}}
	slices.SortFunc(as, pci.Addr.Compare)
	want := []pci.Addr{{}, {Func: 1}, {Slot: 1}, {Bus: 1}, {Domain: 1}}
	if !slices.Equal(as, want) {
		t.Fatalf("sorted = %v", as)
	}
}
