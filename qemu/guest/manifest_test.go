package guest

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestManifestRoundTrip(t *testing.T) {
	in := &Manifest{
		Modules:    []string{"/lib/modules/irqbypass.ko", "/lib/modules/vfio.ko"},
		BindPVRDMA: true,
		Steps: []Step{
			{Name: "vfio.test", Path: "/bin/vfio.test", Args: []string{"-test.run", "TestSmoke"}, Env: []string{"A=1", "B="}, Kind: KindGoTest, Timeout: 90 * time.Second},
			{Name: "pvctl", Path: "/bin/pvctl", Kind: KindCmd, Timeout: time.Second},
		},
	}
	b, err := in.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out, err := UnmarshalManifest(b)
	if err != nil {
		t.Fatalf("UnmarshalManifest(%s): %v", b, err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", out, in)
	}
	if !strings.Contains(string(b), `"timeout_ns": 90000000000`) {
		t.Errorf("timeout not in nanoseconds:\n%s", b)
	}
}

func TestManifestInvalid(t *testing.T) {
	ok := Step{Name: "p", Path: "/bin/p", Kind: KindCmd, Timeout: time.Second}
	with := func(f func(*Step)) Step { s := ok; f(&s); return s }
	for _, tc := range []struct {
		m    Manifest
		want string
	}{
		{Manifest{Steps: []Step{with(func(s *Step) { s.Name = "" })}}, "empty name"},
		{Manifest{Steps: []Step{with(func(s *Step) { s.Name = "a/b" })}}, "slash"},
		{Manifest{Steps: []Step{with(func(s *Step) { s.Name = ".." })}}, "not a file name"},
		{Manifest{Steps: []Step{ok, ok}}, "used twice"},
		{Manifest{Steps: []Step{with(func(s *Step) { s.Path = "bin/p" })}}, "not absolute"},
		{Manifest{Steps: []Step{with(func(s *Step) { s.Kind = "shell" })}}, "kind"},
		{Manifest{Steps: []Step{with(func(s *Step) { s.Timeout = 0 })}}, "timeout"},
		{Manifest{Steps: []Step{with(func(s *Step) { s.Env = []string{"=x"} })}}, "KEY=value"},
		{Manifest{Modules: []string{"vfio.ko"}}, "module path"},
	} {
		if _, err := tc.m.Marshal(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Marshal(%+v) = %v, want an error about %q", tc.m, err, tc.want)
		}
	}
	for _, bad := range []string{`{"steps":[],"extra":1}`, `{"steps":[{"name":"p"}]}`, `[`} {
		if _, err := UnmarshalManifest([]byte(bad)); err == nil {
			t.Errorf("UnmarshalManifest(%s) succeeded", bad)
		}
	}
}
