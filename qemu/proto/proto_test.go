package proto

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// A line a program wrote to stderr says so; one written to stdout carries
// no stream field at all (records of older inits decode the same).
func TestOutputRecordsNameTheirStream(t *testing.T) {
	errLine := Record{Event: EventOut, Prog: "pvctl", Line: "pvctl: no device", Stream: StreamStderr}
	out, ok, err := Parse(errLine.Encode())
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, StreamStderr, out.Stream)

	outLine := Record{Event: EventOut, Prog: "pvctl", Line: "{}"}
	assert.NotContains(t, string(outLine.Encode()), "stream")
	out, _, err = Parse([]byte(Prefix + `{"event":"out","prog":"pvctl","line":"{}","code":0}`))
	require.NoError(t, err)
	assert.Equal(t, StreamStdout, out.Stream)
}
