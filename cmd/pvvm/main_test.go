package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestSplitCommands(t *testing.T) {
	got := splitCommands([]string{"list", "--json", "+", "regs", "+", "+"})
	want := [][]string{{"list", "--json"}, {"regs"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("splitCommands = %q, want %q", got, want)
	}
}

func TestTestArgs(t *testing.T) {
	for _, tc := range []struct {
		c    config
		want []string
	}{
		{config{vms: 1}, []string{"-test.skip", "^TestMultiVM"}},
		{config{vms: 2}, []string{"-test.run", "^TestMultiVM"}},
		{config{vms: 2, run: "^TestSmoke$"}, []string{"-test.run", "^TestSmoke$"}},
	} {
		if got := testArgs(&tc.c); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("testArgs(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
}

func TestGuestPackages(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a/x_guest_test.go", "// Copyright\n\n//go:build guest\n\npackage a\n")
	write("b/y_test.go", "package b\n")
	write("c/z_test.go", "//go:build guest && linux\n\npackage c\n")
	write("d/w_test.go", "//go:build !guest\n\npackage d\n")
	write("build/e/v_test.go", "//go:build guest\n\npackage e\n")
	got, err := guestTestPackages(root, "all")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "c"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("all = %q, want %q", got, want)
	}
	if _, err := guestTestPackages(root, "b"); err == nil {
		t.Fatal("package without guest tests accepted")
	}
	if got, err := guestTestPackages(root, "./a, c"); err != nil || !reflect.DeepEqual(got, []string{"a", "c"}) {
		t.Fatalf("list = %q, %v", got, err)
	}
}
