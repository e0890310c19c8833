package fabric

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func gid(last byte) GID {
	g := GID{0: 0xfe, 1: 0x80}
	g[15] = last
	return g
}

func TestRegisterUnregister(t *testing.T) {
	d := Dir(t.TempDir())
	a, b := gid(1), gid(2)

	ia, err := d.Register("vm0", a)
	if err != nil || ia != FirstIndex {
		t.Fatalf("Register a = %d, %v; want %d", ia, err, FirstIndex)
	}
	ib, err := d.Register("vm0", b)
	if err != nil || ib != FirstIndex+1 {
		t.Fatalf("Register b = %d, %v; want %d", ib, err, FirstIndex+1)
	}
	if again, err := d.Register("vm0", a); err != nil || again != ia {
		t.Fatalf("re-Register a = %d, %v; want %d", again, err, ia)
	}
	raw, err := os.ReadFile(filepath.Join(string(d), "node", "vm0", "gid.2"))
	if err != nil || string(raw) != "fe800000000000000000000000000001\n" {
		t.Fatalf("gid.2 = %q, %v", raw, err)
	}
	if owner, err := d.Owner(b); err != nil || owner != "vm0" {
		t.Fatalf("Owner(b) = %q, %v", owner, err)
	}

	if err := d.Unregister("vm0", a); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Owner(a); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Owner(a) after unregister: %v, want not exist", err)
	}
	// The freed index is reused; b keeps its own.
	c := gid(3)
	if ic, err := d.Register("vm0", c); err != nil || ic != FirstIndex {
		t.Fatalf("Register c = %d, %v; want %d", ic, err, FirstIndex)
	}
	tab, err := d.Table("vm0")
	if err != nil || len(tab) != 2 || tab[FirstIndex] != c || tab[FirstIndex+1] != b {
		t.Fatalf("Table = %v, %v", tab, err)
	}
	if err := d.Unregister("vm0", gid(9)); err != nil {
		t.Fatalf("Unregister of unknown GID: %v", err)
	}
}

func TestRouteOwnedByOtherNodeKept(t *testing.T) {
	d := Dir(t.TempDir())
	g := gid(7)
	if _, err := d.Register("vm0", g); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Register("vm1", g); err != nil { // last writer routes it
		t.Fatal(err)
	}
	if err := d.Unregister("vm0", g); err != nil {
		t.Fatal(err)
	}
	if owner, err := d.Owner(g); err != nil || owner != "vm1" {
		t.Fatalf("Owner = %q, %v; want vm1", owner, err)
	}
}

func TestBadInput(t *testing.T) {
	d := Dir(t.TempDir())
	if _, err := d.Register("../etc", gid(1)); err == nil || !strings.Contains(err.Error(), "bad node name") {
		t.Fatalf("Register with bad node: %v", err)
	}
	if _, err := ParseHex("zz"); err == nil {
		t.Fatal("ParseHex accepted a short string")
	}
	if _, err := ParseHex(strings.Repeat("g", 32)); err == nil {
		t.Fatal("ParseHex accepted non-hex")
	}
	nd := filepath.Join(string(d), "node", "vm0")
	os.MkdirAll(nd, 0o755)
	os.WriteFile(filepath.Join(nd, "gid.2"), []byte("garbage\n"), 0o644)
	if _, err := d.Table("vm0"); err == nil {
		t.Fatal("Table accepted a corrupt entry")
	}
}

func TestTableFull(t *testing.T) {
	d := Dir(t.TempDir())
	for i := FirstIndex; i <= MaxIndex; i++ {
		g := gid(0)
		g[14], g[15] = byte(i>>8), byte(i)
		if _, err := d.Register("n", g); err != nil {
			t.Fatalf("Register %d: %v", i, err)
		}
	}
	if _, err := d.Register("n", gid(0xee)); !errors.Is(err, ErrTableFull) {
		t.Fatalf("Register past the end: %v, want ErrTableFull", err)
	}
}

func TestRemoveNode(t *testing.T) {
	d := Dir(t.TempDir())
	g := gid(5)
	d.Register("vm3", g)
	if err := d.RemoveNode("vm3"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Owner(g); err == nil {
		t.Fatal("route survived RemoveNode")
	}
	if tab, _ := d.Table("vm3"); len(tab) != 0 {
		t.Fatalf("table survived: %v", tab)
	}
}
