package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma/internal/perf"
	"github.com/vfrdma/vfrdma/qemu"
)

// A ping-pong's round trip, seen from the two devices (pvvm -timeline):
// the client's SEND doorbell, the receive's CQE in the server's CQ, the
// server's SEND doorbell, the receive's CQE in the client's CQ, and the
// client's next SEND doorbell. The two QEMU processes stamp their traces
// with one host clock, so the spans between them are comparable: a
// transit is the emulated device, the backend and the fabric moving one
// message (from the doorbell to the CQE in the peer's ring); a turnaround
// is the guest's own time (from the CQE in its ring to its next SEND
// doorbell: noticing the CQE, checking and reposting, posting the reply).

// roundTrips is the breakdown of every round trip of a ping-pong between
// two VMs' timelines.
type roundTrips struct {
	client, server int // VM indexes
	n              int // round trips broken down
	skipped        int // round trips whose events were out of order
	// Each round trip's spans, in order: transit client→server,
	// turnaround at the server, transit server→client, turnaround at the
	// client, and the whole round trip.
	spans [5][]time.Duration
	// notice[i]: from a receive's CQE to the first doorbell other than a
	// POLL that the VM (server 0, client 1) rang after it.
	notice [2][]time.Duration
	// Receive CQEs the VM's vCPU thread wrote (a POLL doorbell harvested
	// the backend) and all of them, per VM (server 0, client 1).
	byVCPU, cqes [2]int
	// POLL doorbells per VM over the round trips broken down, and every
	// doorbell (an exit to the device) by kind.
	polls [2]int
	exits [2]map[string]int
	// The transit to and the turnaround at each VM (server 0, client 1),
	// split by who wrote the receive's CQE: [vm][0] its vCPU (a POLL
	// doorbell's harvest), [vm][1] the device's completion thread.
	transitBy, turnBy [2][2][]time.Duration
}

// breakDown follows each round trip on the two VMs' data paths (each
// VM's QP that rang the most SEND doorbells and QP that took the most
// receives: what else the run sent, a library's wire-up or its messages
// to itself, goes on other QPs). The client is the VM whose first SEND
// came first. From each client SEND it takes the server's first receive
// CQE after it, the server's first SEND after that, the client's first
// receive CQE after that, and the client's first SEND after that: a round
// trip when that is the client's next SEND; otherwise (something else
// went on those QPs in between, a library's own control message or a
// barrier) it is left out and counted as skipped, as is a round trip
// whose server CQE the one before took.
func breakDown(vms [2][]qemu.DeviceEvent) (*roundTrips, error) {
	var sends, recvs [2][]qemu.DeviceEvent
	var vcpu [2]int
	for v, evs := range vms {
		sendQP, recvQP := busiest(evs)
		for _, ev := range evs {
			switch {
			case ev.Kind == "QP SEND" && ev.Obj == sendQP:
				sends[v] = append(sends[v], ev)
				vcpu[v] = ev.Thread
			case ev.Kind == qemu.CQEKind && ev.Opcode == qemu.CQERecv && ev.Status == 0 && ev.QPN == recvQP:
				recvs[v] = append(recvs[v], ev)
			}
		}
		// Two threads write a VM's log (the vCPU's, the completion
		// thread's): put each list in time order for the searches below.
		byTime := func(a, b qemu.DeviceEvent) int { return a.At.Compare(b.At) }
		slices.SortStableFunc(sends[v], byTime)
		slices.SortStableFunc(recvs[v], byTime)
	}
	for v := range sends {
		if len(sends[v]) == 0 {
			return nil, fmt.Errorf("vm%d rang no SEND doorbell: no ping-pong to break down", v)
		}
	}
	c, s := 0, 1
	if sends[1][0].At.Before(sends[0][0].At) {
		c, s = 1, 0
	}
	r := &roundTrips{client: c, server: s}
	role := [2]int{} // VM index → 0 server, 1 client
	role[c], role[s] = 1, 0
	// after returns the first of evs (in time order) at or after t.
	after := func(evs []qemu.DeviceEvent, t time.Time) (qemu.DeviceEvent, bool) {
		i := sort.Search(len(evs), func(i int) bool { return !evs[i].At.Before(t) })
		if i == len(evs) {
			return qemu.DeviceEvent{}, false
		}
		return evs[i], true
	}
	var firstRT, lastRT, claimed time.Time // claimed: the server CQE the last round trip took
	for k := 0; k+1 < len(sends[c]); k++ {
		var cqeS, sendS, cqeC, next qemu.DeviceEvent
		ok := true
		for _, step := range []struct {
			into *qemu.DeviceEvent
			evs  []qemu.DeviceEvent
			from *qemu.DeviceEvent
		}{{&cqeS, recvs[s], &sends[c][k]}, {&sendS, sends[s], &cqeS}, {&cqeC, recvs[c], &sendS}, {&next, sends[c], &cqeC}} {
			if ok {
				*step.into, ok = after(step.evs, step.from.At)
			}
		}
		if !ok {
			break // the run ended before this round trip did
		}
		taken := cqeS.At.Equal(claimed) // the round trip before took this CQE: this send was not answered on its own
		claimed = cqeS.At
		if next != sends[c][k+1] || taken {
			r.skipped++
			continue
		}
		t := [5]time.Time{sends[c][k].At, cqeS.At, sendS.At, cqeC.At, next.At}
		if r.n == 0 {
			firstRT = t[0]
		}
		lastRT = t[4]
		r.n++
		for i := 0; i < 4; i++ {
			r.spans[i] = append(r.spans[i], t[i+1].Sub(t[i]))
		}
		r.spans[4] = append(r.spans[4], t[4].Sub(t[0]))
		for rv, cqe := range [2]qemu.DeviceEvent{cqeS, cqeC} {
			h := 1
			if cqe.Thread == vcpu[[2]int{s, c}[rv]] {
				h = 0
			}
			r.transitBy[rv][h] = append(r.transitBy[rv][h], t[2*rv+1].Sub(t[2*rv]))
			r.turnBy[rv][h] = append(r.turnBy[rv][h], t[2*rv+2].Sub(t[2*rv+1]))
		}
	}
	if r.n == 0 {
		return nil, fmt.Errorf("no round trip: vm%d's SEND doorbells (%d) never met an answer from vm%d before the next (%d skipped)", c, len(sends[c]), s, r.skipped)
	}
	first, last := firstRT, lastRT
	for v, evs := range vms {
		rv := role[v]
		r.exits[rv] = map[string]int{}
		for i, ev := range evs {
			if ev.At.Before(first) || ev.At.After(last) {
				continue
			}
			if ev.Kind != qemu.CQEKind {
				r.exits[rv][ev.Kind]++
			}
			switch {
			case ev.Kind == "CQ POLL":
				r.polls[rv]++
			case ev.Kind == qemu.CQEKind && ev.Opcode == qemu.CQERecv && ev.Status == 0:
				r.cqes[rv]++
				if ev.Thread == vcpu[v] {
					r.byVCPU[rv]++
				}
				for _, next := range evs[i+1:] {
					if next.Kind != qemu.CQEKind && next.Kind != "CQ POLL" {
						r.notice[rv] = append(r.notice[rv], next.At.Sub(ev.At))
						break
					}
				}
			}
		}
	}
	return r, nil
}

// busiest returns the QP handle that rang the most SEND doorbells in a
// VM's timeline, and the QP number that took the most good receives.
func busiest(evs []qemu.DeviceEvent) (sendQP, recvQPN uint32) {
	sends, recvs := map[uint32]int{}, map[uint32]int{}
	for _, ev := range evs {
		switch {
		case ev.Kind == "QP SEND":
			sends[ev.Obj]++
		case ev.Kind == qemu.CQEKind && ev.Opcode == qemu.CQERecv && ev.Status == 0:
			recvs[ev.QPN]++
		}
	}
	top := func(m map[uint32]int) uint32 {
		var best uint32
		for k, n := range m {
			if n > m[best] || n == m[best] && k < best {
				best = k
			}
		}
		return best
	}
	return top(sends), top(recvs)
}

// print writes the breakdown: the medians of each span, and how the
// receives' CQEs were harvested.
func (r *roundTrips) print(w io.Writer) {
	us := func(d time.Duration) string { return fmt.Sprintf("%7.1f", float64(d)/1e3) }
	c, s := r.client, r.server
	fmt.Fprintf(w, "round trips broken down (device timelines, pvvm -timeline): %d", r.n)
	if r.skipped > 0 {
		fmt.Fprintf(w, " (%d more out of order, left out)", r.skipped)
	}
	fmt.Fprintf(w, "; vm%d is the client; medians in µs:\n", c)
	sum := time.Duration(0)
	meds := [5]time.Duration{}
	for i := range r.spans {
		meds[i] = perf.Median(r.spans[i])
		if i < 4 {
			sum += meds[i]
		}
	}
	fmt.Fprintf(w, "  transit vm%d→vm%d (SEND doorbell → receive CQE)   %s\n", c, s, us(meds[0]))
	fmt.Fprintf(w, "  turnaround at vm%d (CQE → SEND doorbell)          %s  (CQE → its next doorbell but POLL: %s)\n", s, us(meds[1]), us(perf.Median(r.notice[0])))
	fmt.Fprintf(w, "  transit vm%d→vm%d                                 %s\n", s, c, us(meds[2]))
	fmt.Fprintf(w, "  turnaround at vm%d                                %s  (CQE → its next doorbell but POLL: %s)\n", c, us(meds[3]), us(perf.Median(r.notice[1])))
	fmt.Fprintf(w, "  round trip                                      %s  (the four medians add up to %s)\n", us(meds[4]), us(sum))
	fmt.Fprintf(w, "  medians µs: to-server %.1f server %.1f to-client %.1f client %.1f round-trip %.1f\n",
		float64(meds[0])/1e3, float64(meds[1])/1e3, float64(meds[2])/1e3, float64(meds[3])/1e3, float64(meds[4])/1e3)
	for rv, v := range [2]int{s, c} {
		pct := 0.0
		if r.cqes[rv] > 0 {
			pct = 100 * float64(r.byVCPU[rv]) / float64(r.cqes[rv])
		}
		per := 0.0
		if r.n > 0 {
			per = float64(r.polls[rv]) / float64(r.n)
		}
		fmt.Fprintf(w, "  vm%d: %.1f POLL doorbells per round trip; %.0f%% of its receive CQEs written by its vCPU (a POLL doorbell's harvest), the rest by the device's completion thread\n", v, per, pct)
		if r.n > 0 {
			kinds := slices.Sorted(maps.Keys(r.exits[rv]))
			var b strings.Builder
			for _, k := range kinds {
				fmt.Fprintf(&b, ", %s %.2f", k, float64(r.exits[rv][k])/float64(r.n))
			}
			fmt.Fprintf(w, "    doorbells (exits to the device) per round trip by kind%s\n", b.String())
		}
		for h, who := range []string{"its vCPU", "the completion thread"} {
			if n := len(r.transitBy[rv][h]); n > 0 {
				fmt.Fprintf(w, "    CQE written by %s (%d): transit to vm%d %s, turnaround %s\n", who, n, v, us(perf.Median(r.transitBy[rv][h])), us(perf.Median(r.turnBy[rv][h])))
			}
		}
	}
}

// printBreakdown prints, for each VM, the spacing of its SEND doorbells
// (a sender's cost per message, in a rate run) and, when the two VMs'
// events pair up as a ping-pong's, the round trips broken down (other
// runs get a note saying why not).
func printBreakdown(w io.Writer, res *qemu.Result) error {
	if len(res.VMs) != 2 {
		return fmt.Errorf("-timeline: a round trip is broken down between two VMs, not %d", len(res.VMs))
	}
	var tl [2][]qemu.DeviceEvent
	for i, vm := range res.VMs {
		if vm.TimelineErr != nil {
			return fmt.Errorf("-timeline: vm%d: %w", i, vm.TimelineErr)
		}
		tl[i] = vm.Timeline
		if g := sendGaps(vm.Timeline); len(g) > 0 {
			fmt.Fprintf(w, "vm%d: %d SEND doorbells, %.1f µs apart (median; 90th percentile %.1f µs)\n",
				i, len(g)+1, float64(perf.Median(g))/1e3, float64(perf.Quantile(g, 0.9))/1e3)
		}
	}
	r, err := breakDown(tl)
	if err != nil {
		fmt.Fprintf(w, "no round trip broken down: %v\n", err)
		return nil
	}
	r.print(w)
	return nil
}

// sendGaps is the time between each SEND doorbell and the next.
func sendGaps(evs []qemu.DeviceEvent) []time.Duration {
	var gaps []time.Duration
	var last time.Time
	for _, ev := range evs {
		if ev.Kind != "QP SEND" {
			continue
		}
		if !last.IsZero() {
			gaps = append(gaps, ev.At.Sub(last))
		}
		last = ev.At
	}
	return gaps
}
