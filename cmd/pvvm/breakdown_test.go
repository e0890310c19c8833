package main

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/internal/perf"
	"github.com/vfrdma/vfrdma/qemu"
)

// pingpongTimelines makes two VMs' timelines of n round trips: vm1 sends
// first; each transit takes 100 µs (to vm0) and 120 µs (to vm1), vm0
// turns around in 30 µs and vm1 in 50 µs; vm0's vCPU harvests every
// other receive with a POLL doorbell, vm1's completion thread all of its.
func pingpongTimelines(n int) [2][]qemu.DeviceEvent {
	const vcpu0, comp0, vcpu1, comp1 = 10, 11, 20, 21
	t := time.Unix(1000, 0)
	at := func(us int) time.Time { return t.Add(time.Duration(us) * time.Microsecond) }
	var vm [2][]qemu.DeviceEvent
	for k, base := 0, 0; k < n; k, base = k+1, base+300 {
		vm[1] = append(vm[1], qemu.DeviceEvent{At: at(base), Thread: vcpu1, Kind: "QP SEND"})
		harvester := comp0
		if k%2 == 0 {
			vm[0] = append(vm[0], qemu.DeviceEvent{At: at(base + 99), Thread: vcpu0, Kind: "CQ POLL"})
			harvester = vcpu0
		}
		vm[0] = append(vm[0],
			qemu.DeviceEvent{At: at(base + 100), Thread: harvester, Kind: qemu.CQEKind, Opcode: qemu.CQERecv},
			qemu.DeviceEvent{At: at(base + 120), Thread: vcpu0, Kind: "QP RECV"},
			qemu.DeviceEvent{At: at(base + 130), Thread: vcpu0, Kind: "QP SEND"})
		vm[1] = append(vm[1],
			qemu.DeviceEvent{At: at(base + 200), Thread: comp1, Kind: qemu.CQEKind, Opcode: qemu.CQESend},
			qemu.DeviceEvent{At: at(base + 250), Thread: comp1, Kind: qemu.CQEKind, Opcode: qemu.CQERecv})
	}
	return vm
}

// A round trip is split into the two transits and the two turnarounds
// from the devices' events alone, the client found by who sent first,
// and each receive's CQE told by the thread that wrote it. Ten messages
// each way are nine round trips (the last has no next send to end it).
func TestTheBreakdownSplitsARoundTripIntoTransitsAndTurnarounds(t *testing.T) {
	r, err := breakDown(pingpongTimelines(10))
	require.NoError(t, err)
	assert.Equal(t, 1, r.client)
	assert.Equal(t, 0, r.server)
	assert.Equal(t, 9, r.n)
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	for i, want := range []time.Duration{us(100), us(30), us(120), us(50), us(300)} {
		assert.Equal(t, want, perf.Median(r.spans[i]), "span %d", i)
	}
	assert.Equal(t, us(20), perf.Median(r.notice[0]), "vm0: CQE → its RECV doorbell")
	assert.Equal(t, [2]int{5, 0}, r.byVCPU)
	assert.Equal(t, [2]int{9, 9}, r.cqes)
	assert.Equal(t, 5, r.polls[0])
	assert.Len(t, r.turnBy[0][0], 5)
	assert.Len(t, r.turnBy[0][1], 4)
	assert.Len(t, r.turnBy[1][1], 9)
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "vm1 is the client")
	assert.Contains(t, out.String(), "56% of its receive CQEs written by its vCPU")
}

// Events that are not a ping-pong's are refused, not broken down wrongly:
// a VM that never sent, and a stream one way that the other end answers
// once at the end. A round trip cut short by the end of the run is left
// out, and one that something else came into the middle of is skipped.
func TestTheBreakdownRefusesWhatIsNotAPingPong(t *testing.T) {
	tl := pingpongTimelines(4)
	_, err := breakDown([2][]qemu.DeviceEvent{tl[0], nil})
	assert.ErrorContains(t, err, "rang no SEND doorbell")

	var oneWay [2][]qemu.DeviceEvent
	for _, ev := range tl[1] {
		if ev.Kind == "QP SEND" {
			oneWay[1] = append(oneWay[1], ev)
		}
	}
	for _, ev := range tl[0] {
		if ev.Kind == qemu.CQEKind {
			oneWay[0] = append(oneWay[0], ev)
		}
	}
	oneWay[0] = append(oneWay[0], qemu.DeviceEvent{At: time.Unix(1005, 0), Kind: "QP SEND"})
	_, err = breakDown(oneWay)
	assert.ErrorContains(t, err, "no round trip")

	tl = pingpongTimelines(5)
	tl[0] = tl[0][:len(tl[0])-1] // vm0's last echo never sent
	// vm1 sends once more between its second send and the answer to it.
	tl[1] = append(tl[1], qemu.DeviceEvent{At: time.Unix(1000, 0).Add(310 * time.Microsecond), Kind: "QP SEND"})
	slices.SortStableFunc(tl[1], func(a, b qemu.DeviceEvent) int { return a.At.Compare(b.At) })
	r, err := breakDown(tl)
	require.NoError(t, err)
	assert.Equal(t, 3, r.n, "the last round trip was cut short")
	assert.Equal(t, 2, r.skipped, "the send in the middle: the round trips on either side of it")
}

// Every run with -timeline reports how far apart each VM's SEND doorbells
// are (a sender's cost per message); a run that is not a ping-pong gets a
// note instead of the round trips, and does not fail.
func TestTheTimelineReportsTheSendSpacingAndNotesARunThatIsNotAPingPong(t *testing.T) {
	at := func(us int) time.Time { return time.Unix(1000, 0).Add(time.Duration(us) * time.Microsecond) }
	var sender []qemu.DeviceEvent
	for k := 0; k < 11; k++ {
		sender = append(sender, qemu.DeviceEvent{At: at(20 * k), Kind: "QP SEND"}, qemu.DeviceEvent{At: at(20*k + 5), Kind: "CQ POLL"})
	}
	res := &qemu.Result{VMs: []*qemu.VMResult{{Index: 0}, {Index: 1, Timeline: sender}}}
	var out bytes.Buffer
	require.NoError(t, printBreakdown(&out, res))
	assert.Contains(t, out.String(), "vm1: 11 SEND doorbells, 20.0 µs apart (median; 90th percentile 20.0 µs)")
	assert.Contains(t, out.String(), "no round trip broken down: vm0 rang no SEND doorbell")
}

// A ping-pong on one QP pair is broken down though the run sent more on
// other QPs (a library's wire-up, a task's messages to itself): each VM's
// data path is its busiest SEND QP and its busiest receiving QP. The
// doorbells per round trip are counted by kind.
func TestTheBreakdownFollowsTheDataQPsAndCountsDoorbellsByKind(t *testing.T) {
	tl := pingpongTimelines(10)
	at := func(us int) time.Time { return time.Unix(1000, 0).Add(time.Duration(us) * time.Microsecond) }
	for v := range tl {
		for i := range tl[v] {
			if tl[v][i].Kind == "QP SEND" {
				tl[v][i].Obj = 5
			}
			if tl[v][i].Kind == qemu.CQEKind {
				tl[v][i].QPN = 0x20
			}
		}
		// Wire-up before the ping-pong and a message to itself within it,
		// on other QPs.
		tl[v] = append([]qemu.DeviceEvent{{At: at(-50), Kind: "QP SEND", Obj: 9}, {At: at(-40), Kind: qemu.CQEKind, Opcode: qemu.CQERecv, QPN: 0x30}}, tl[v]...)
		tl[v] = append(tl[v], qemu.DeviceEvent{At: at(1001), Kind: "QP SEND", Obj: 7}, qemu.DeviceEvent{At: at(1002), Kind: qemu.CQEKind, Opcode: qemu.CQERecv, QPN: 0x31})
		slices.SortStableFunc(tl[v], func(a, b qemu.DeviceEvent) int { return a.At.Compare(b.At) })
	}
	r, err := breakDown(tl)
	require.NoError(t, err)
	assert.Equal(t, 9, r.n)
	assert.Equal(t, 300*time.Microsecond, perf.Median(r.spans[4]))
	assert.Equal(t, 9, r.exits[0]["QP RECV"])
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "doorbells (exits to the device) per round trip by kind, CQ POLL 0.56, QP RECV 1.00, QP SEND 1.")
}
