package vfrdma

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // created on the first write
	path := journalPath(dir, "0000:00:10.1")
	if filepath.Base(path) != "objects-0000_00_10.1.json" {
		t.Fatalf("journal path %s", path)
	}
	j := journal{path: path}
	j.add(kindBind, 0)
	j.add(kindPD, 1)
	j.add(kindCQ, 2)
	j.add(kindQP, 77)
	j.add(kindMR, 3)
	j.remove(kindCQ, 2)
	j.remove(kindCQ, 9) // not there: nothing happens
	if j.err != nil {
		t.Fatal(j.err)
	}
	left, err := readJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	// Destroy order: users before what they use, bindings last.
	want := []journalEntry{{kindQP, 77}, {kindMR, 3}, {kindPD, 1}, {kindBind, 0}}
	if !reflect.DeepEqual(left, want) {
		t.Fatalf("leftovers %v, want %v", left, want)
	}
	for _, e := range want {
		j.remove(e.Kind, e.Handle)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("empty journal not removed: %v", err)
	}
	if left, err := readJournal(path); err != nil || left != nil {
		t.Fatalf("readJournal of no file = %v, %v", left, err)
	}
	if left, err := readJournal(""); err != nil || left != nil {
		t.Fatalf("disabled journal = %v, %v", left, err)
	}
	os.MkdirAll(dir, 0o755)
	os.WriteFile(path, []byte("{garbage"), 0o600)
	if _, err := readJournal(path); err == nil {
		t.Fatal("corrupt journal accepted")
	}
}

func TestJournalDisabled(t *testing.T) {
	var j journal // no path: a no-op
	j.add(kindPD, 1)
	j.remove(kindPD, 1)
	if j.err != nil || j.live != nil {
		t.Fatalf("disabled journal recorded %v, %v", j.live, j.err)
	}
	o := (&Options{StateDir: "-"}).withDefaults()
	if o.StateDir != "" {
		t.Fatalf(`StateDir "-" gave %q`, o.StateDir)
	}
	if o := (*Options)(nil).withDefaults(); o.StateDir != DefaultStateDir || o.CommandTimeout != DefaultCommandTimeout || o.Logger == nil {
		t.Fatalf("defaults %+v", o)
	}
}

func TestGIDString(t *testing.T) {
	g := GID{0xfe, 0x80, 8: 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56}
	if g.String() != "fe80::5054:ff:fe12:3456" {
		t.Fatalf("GID %s", g)
	}
}
