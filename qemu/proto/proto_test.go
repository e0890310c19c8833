package proto

import "testing"

func TestRecordRoundTrip(t *testing.T) {
	in := Record{Event: EventTest, Prog: "vfio.test", Test: "TestSmoke", Status: StatusPass, Elapsed: 0.25}
	line := in.Encode()
	out, ok, err := Parse(line)
	if !ok || err != nil {
		t.Fatalf("Parse(%q) = ok %v, err %v", line, ok, err)
	}
	if out != in {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line    string
		ok, bad bool
		event   string
	}{
		{line: "[    1.23] vfio-pci 0000:00:10.1: enabling device", ok: false},
		{line: Prefix + `{"event":"done","code":0}`, ok: true, event: EventDone},
		{line: "[  2.0] racing kernel text" + Prefix + `{"event":"exit","prog":"p","code":3}` + "\r\n", ok: true, event: EventExit},
		{line: Prefix + `{"event":`, ok: true, bad: true},
		{line: Prefix + `{"prog":"x"}`, ok: true, bad: true},
	} {
		r, ok, err := Parse([]byte(tc.line))
		if ok != tc.ok || (err != nil) != tc.bad {
			t.Errorf("Parse(%q): ok %v err %v; want ok %v bad %v", tc.line, ok, err, tc.ok, tc.bad)
			continue
		}
		if ok && !tc.bad && r.Event != tc.event {
			t.Errorf("Parse(%q).Event = %q, want %q", tc.line, r.Event, tc.event)
		}
	}
}
