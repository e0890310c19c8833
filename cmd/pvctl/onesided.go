package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/internal/perf"
)

// The one-sided modes of pingpong and bench (--write, --read, --atomic):
// one end, the initiator, names the other end's target region (its
// receive MR, registered with the mode's remote rights) by the region the
// ends exchanged (connect.Region; in loopback both ends are in this
// process); the target posts nothing for them. The region is cut in
// slots of the message size, one per queue entry, like the SEND buffers.
//
// What is checked: RDMA WRITE, the target's slots, each holding the
// initiator's pattern or untouched zeros (pingpong --write: the WRITE
// WITH IMMEDIATE's receive completion and every byte); RDMA READ, every
// byte read into a local slot zeroed before the READ; fetch-and-add of 1
// on the region's first 8-byte word, each fetched value (RC executes them
// in order: the n-th returns n-1) and the word's final value, read back
// with an RDMA READ (and, in loopback, in the target's memory).
const (
	sideWrite  = "write"
	sideRead   = "read"
	sideAtomic = "atomic"
)

// sideFlag is a one-sided mode's flag as the user types it; "" (SEND)
// reads as "no one-sided flag".
func sideFlag(sided string) string {
	if sided == "" {
		return "no one-sided flag (SEND)"
	}
	return "--" + sided
}

// registerOneSided adds --write and --read, and with atomic --atomic.
func (t *trafficFlags) registerOneSided(fs *flag.FlagSet, write, atomic string) {
	fs.BoolVar(&t.write, "write", false, write)
	fs.BoolVar(&t.read, "read", false, "one-sided: RDMA READ of the other end's buffer, every byte checked; the other end posts nothing (RC only, not on QEMU)")
	if atomic != "" {
		fs.BoolVar(&t.atomic, "atomic", false, atomic)
	}
}

// resolveSided sets t.sided from the one-sided flags, and refuses what
// they cannot run with.
func (t *trafficFlags) resolveSided(fs *flag.FlagSet) error {
	n := 0
	for _, f := range []struct {
		on   bool
		mode string
	}{{t.write, sideWrite}, {t.read, sideRead}, {t.atomic, sideAtomic}} {
		if f.on {
			t.sided = f.mode
			n++
		}
	}
	switch {
	case n > 1:
		return usageErrorf("--write, --read and --atomic exclude each other")
	case n == 0:
		return nil
	case t.ud:
		return usageErrorf("--%s needs RC QPs (--ud given): one-sided operations run on connected QPs only", t.sided)
	case t.rdmaCore:
		return usageErrorf("--%s: rdma-core's pingpongs exchange no address or rkey: no --rdma-core", t.sided)
	}
	if t.sided == sideAtomic {
		if given(fs, "size") && t.size != 8 {
			return usageErrorf("--atomic --size %d: the atomic works on one 8-byte word (leave --size out)", t.size)
		}
		t.size = 8 // the atomic's word
	}
	return nil
}

// checkDevice refuses a one-sided mode on a device that does not run
// one-sided operations (QEMU 7.2: the driver would refuse each post with
// ErrNotSupported), before anything is set up or exchanged: an initiator
// failing there would leave its peer waiting.
func (t *trafficFlags) checkDevice(d *vfrdma.Device) error {
	if t.sided == "" || !d.Quirks().Emulated {
		return nil
	}
	return fmt.Errorf("--%s: %w: the device is QEMU 7.2's pvrdma, which runs every send WQE as a plain SEND "+
		"(no RDMA WRITE, READ or atomic); run it on a VMware device, or on the model (pvctl --model v20)", t.sided, vfrdma.ErrNotSupported)
}

// remoteAccess is the rights a mode's target region grants.
func remoteAccess(sided string) vfrdma.Access {
	switch sided {
	case sideWrite:
		return vfrdma.AccessRemoteWrite
	case sideRead:
		return vfrdma.AccessRemoteRead
	case sideAtomic:
		return vfrdma.AccessRemoteAtomic | vfrdma.AccessRemoteRead // read: the final value, read back
	}
	return 0
}

// prepareTarget sets e's target region up for a run of its mode: a READ
// target holds the pattern of each slot (the slot's number), the others
// zeros.
func prepareTarget(e *endpoint, sided string) {
	b := e.recv.Bytes()
	clear(b)
	if sided == sideRead {
		for s := 0; s < e.depth; s++ {
			pattern(b[s*e.slot:][:e.slot], s)
		}
	}
}

// terms are what two ends of pingpong and bench agree on beyond their
// QPs and regions: the one-sided mode ("" for SEND) and the bytes per
// slot of the target region. They travel as the exchange's data (JSON;
// none for SEND, as rdma-core's exchange carries none).
type terms struct {
	OneSided string `json:"one_sided,omitempty"`
	Slot     int    `json:"slot,omitempty"`
}

func (t terms) encode() []byte {
	if t == (terms{}) {
		return nil
	}
	b, _ := json.Marshal(t) // two plain fields: cannot fail
	return b
}

// termsOf decodes the terms of the peer's Info (none: SEND).
func termsOf(in connect.Info) (terms, error) {
	var t terms
	if len(in.Data) == 0 {
		return t, nil
	}
	if err := json.Unmarshal(in.Data, &t); err != nil {
		return t, fmt.Errorf("the other end's terms %.64q: %w", in.Data, err)
	}
	return t, nil
}

// checkPeer refuses a peer that runs another mode, or whose target region
// does not hold this end's slots; it takes the peer's region as e's
// target.
func (e *endpoint) checkPeer(peer connect.Info) error {
	t, err := termsOf(peer)
	if err != nil {
		return err
	}
	if t.OneSided != e.sided {
		return fmt.Errorf("the other end runs with %s, this one with %s: give both ends the same mode", sideFlag(t.OneSided), sideFlag(e.sided))
	}
	if e.sided == "" {
		return nil
	}
	if t.Slot != e.slot {
		return fmt.Errorf("the other end's slots are %d bytes, this end's %d: give both ends the same --size", t.Slot, e.slot)
	}
	if len(peer.Regions) != 1 {
		return fmt.Errorf("the other end offers %d target regions, want 1", len(peer.Regions))
	}
	need := uint64(e.depth * e.slot)
	if r := peer.Regions[0]; !r.Holds(0, need) {
		return fmt.Errorf("the other end's target region holds %d bytes, this end needs %d", r.Len, need)
	}
	e.target = peer.Regions[0]
	return nil
}

// checkWritten checks e's region after RDMA WRITEs of the pattern: each
// slot holds its pattern or is untouched (zeros). It returns how many
// slots hold the pattern.
func checkWritten(e *endpoint) (int, error) {
	if e.slot == 0 {
		return 0, nil // zero-byte WRITEs leave nothing to check
	}
	b := e.recv.Bytes()
	written := 0
	for s := 0; s < e.depth; s++ {
		slot := b[s*e.slot:][:e.slot]
		if checkPattern(slot, s) == nil {
			written++
			continue
		}
		for i, c := range slot {
			if c != 0 {
				return written, fmt.Errorf("target slot %d: byte %d is %#x: neither the pattern (%#x) nor untouched", s, i, c, byte(s+i*13))
			}
		}
	}
	return written, nil
}

// word reads the atomic's word in e's own region (the target's view).
func word(e *endpoint) uint64 { return binary.LittleEndian.Uint64(e.recv.Bytes()) }

// remoteOp is what benchSend posts instead of SEND: the mode's operation
// on a's peer's region, slot by slot, and the check of each completion.
type remoteOp struct {
	sided   string
	opcode  vfrdma.Opcode
	wc      vfrdma.WCOpcode // what its completions report
	target  connect.Region  // the peer's
	depth   int             // slots used in each region
	local   []byte          // the initiator's send MR: where READs and atomics land
	slot    int             // bytes per slot, the same at both ends
	checked int             // completions whose data was checked
}

func newRemoteOp(a *endpoint) *remoteOp {
	r := &remoteOp{sided: a.sided, target: a.target, depth: a.depth, local: a.send.Bytes(), slot: a.slot}
	switch a.sided {
	case sideWrite:
		r.opcode, r.wc = vfrdma.OpRDMAWrite, vfrdma.WCRDMAWrite
		for s := 0; s < a.depth; s++ {
			pattern(r.local[s*a.slot:][:a.slot], s)
		}
	case sideRead:
		// What a READ brings lands on zeros: done clears each slot again
		// once checked (outside the timed post).
		r.opcode, r.wc = vfrdma.OpRDMARead, vfrdma.WCRDMARead
		clear(r.local)
	case sideAtomic:
		r.opcode, r.wc = vfrdma.OpAtomicFetchAdd, vfrdma.WCFetchAdd
	}
	return r
}

// fill turns wr (sendWR's, from local slot seq%depth) into operation seq.
func (r *remoteOp) fill(wr *vfrdma.SendWR, seq int) {
	wr.Opcode, wr.RKey = r.opcode, r.target.RKey
	if r.sided == sideAtomic {
		wr.RemoteAddr, wr.CompareAdd = r.target.Addr, 1
		return
	}
	wr.RemoteAddr = r.target.Addr + uint64(seq%r.depth*r.slot)
}

// done checks a successful completion of benchSend's operation wc.WRID.
func (r *remoteOp) done(wc *vfrdma.WC) error {
	if wc.Opcode != r.wc {
		return fmt.Errorf("operation %d: completion opcode %v, want %v", wc.WRID, wc.Opcode, r.wc)
	}
	s := int(wc.WRID) % r.depth
	got := r.local[s*r.slot:][:r.slot]
	switch r.sided {
	case sideRead:
		if err := checkPattern(got, s); err != nil {
			return fmt.Errorf("READ %d from the other end's slot %d: %w", wc.WRID, s, err)
		}
		clear(got)
	case sideAtomic:
		// The word starts each batch at zero and RC runs the adds in
		// order: the n-th fetches n-1.
		if v := binary.LittleEndian.Uint64(got); v != wc.WRID {
			return fmt.Errorf("fetch-and-add %d fetched %d, want %d (the adds before it)", wc.WRID, v, wc.WRID)
		}
	default:
		return nil // the target checks its slots
	}
	r.checked++
	return nil
}

// readWord reads the peer's atomic word back with an RDMA READ into a's
// slot 0 (a's queue is empty: benchSend reaped everything).
func readWord(ctx context.Context, a *endpoint) (uint64, error) {
	local := a.send.Bytes()[:8]
	clear(local)
	sge := [1]vfrdma.SGE{a.send.SGE(0, 8)}
	wr := [1]vfrdma.SendWR{{WRID: 1 << 62, Opcode: vfrdma.OpRDMARead, SGEs: sge[:], RemoteAddr: a.target.Addr, RKey: a.target.RKey}}
	if _, err := a.qp.PostSend(wr[:], 0); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wcs := make([]vfrdma.WC, 1)
	n, err := a.cq.WaitN(wctx, wcs, 1)
	switch {
	case err != nil:
		return 0, fmt.Errorf("reading the word back: %w", err)
	case n != 1 || wcs[0].WRID != wr[0].WRID || wcs[0].Status != vfrdma.WCSuccess:
		return 0, fmt.Errorf("reading the word back: completion %+v", wcs[0])
	}
	return binary.LittleEndian.Uint64(local), nil
}

// opName is the operation a mode's bench posts.
func opName(sided string) string {
	switch sided {
	case sideWrite:
		return vfrdma.OpRDMAWrite.String()
	case sideRead:
		return vfrdma.OpRDMARead.String()
	case sideAtomic:
		return vfrdma.OpAtomicFetchAdd.String()
	}
	return vfrdma.OpSend.String()
}

// benchOneSided is bench --write, --read or --atomic: a (the client
// between hosts) posts the operations in batches as benchSend posts
// SENDs; the target (b in loopback, the server between hosts) posts
// nothing, and checks its region after each batch (write: the slots;
// atomic: the word, which the initiator also reads back).
func benchOneSided(ctx context.Context, e *env, t *trafficFlags, a, b *endpoint, x exchanger, batches []int, messages int, so sendOpts) error {
	res := benchResult{Transport: vfrdma.RC.String(), Operation: opName(t.sided), Size: t.size, Mode: "loopback",
		Latency: "post to completion", Window: so.window, SenderSpins: so.spin}
	target := b // loopback: the target's memory is in this process
	switch {
	case x != nil && x.server():
		res.Mode, target = "target", a
	case x != nil:
		res.Mode = "initiator"
	}
	for _, batch := range batches {
		if target != nil {
			prepareTarget(target, t.sided)
		}
		if x != nil {
			if err := x.barrier(ctx, fmt.Sprintf("bench-%d", batch)); err != nil {
				return err
			}
		}
		row := benchRow{Batch: batch}
		if res.Mode != "target" {
			r := newRemoteOp(a)
			so := so
			so.remote = r
			var err error
			if row, err = benchSend(ctx, a, nil, messages, batch, so); err != nil {
				return fmt.Errorf("batch %d: %w", batch, err)
			}
			row.Checked = r.checked
			if t.sided == sideAtomic {
				if row.Word, err = readWord(ctx, a); err != nil {
					return fmt.Errorf("batch %d: %w", batch, err)
				}
				if row.Word != uint64(messages) {
					return fmt.Errorf("batch %d: the word holds %d after %d fetch-and-adds of 1 (read back by RDMA READ)", batch, row.Word, messages)
				}
			}
		}
		if x != nil {
			if err := x.barrier(ctx, fmt.Sprintf("bench-%d-done", batch)); err != nil {
				return err
			}
		}
		if err := checkTarget(t.sided, target, &row, messages, x == nil); err != nil {
			return fmt.Errorf("batch %d: %w", batch, err)
		}
		res.Rows = append(res.Rows, row)
	}
	if e.json {
		return e.printJSON(res)
	}
	return printOneSided(e, t.sided, &res)
}

// checkTarget checks the target's region after a batch (nothing to do
// without the target here, or for READs): a WRITE target's slots, an
// atomic's word; in loopback against the number of operations.
func checkTarget(sided string, target *endpoint, row *benchRow, messages int, loopback bool) error {
	if target == nil {
		return nil
	}
	switch sided {
	case sideWrite:
		n, err := checkWritten(target)
		if err != nil {
			return err
		}
		want := min(messages, target.depth)
		if target.slot == 0 {
			want = 0
		}
		if loopback && n != want {
			return fmt.Errorf("%d target slots hold the pattern after %d RDMA WRITEs, want %d", n, messages, want)
		}
		row.TargetChecked = n
	case sideAtomic:
		w := word(target)
		if loopback && w != uint64(messages) {
			return fmt.Errorf("the word holds %d in the target's memory after %d fetch-and-adds of 1", w, messages)
		}
		row.Word = w
	}
	return nil
}

// printOneSided prints a one-sided bench's table.
func printOneSided(e *env, sided string, res *benchResult) error {
	what := map[string]string{
		sideWrite:  "target slots checked",
		sideRead:   "reads checked",
		sideAtomic: "fetches checked\tword after",
	}[sided]
	w := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	if res.Mode == "target" {
		fmt.Fprintf(e.out, "RC %s bench target, %d bytes per operation: this end posts nothing (the initiator reports rates and latency)\n", res.Operation, res.Size)
		switch sided {
		case sideWrite:
			fmt.Fprintln(w, "batch\tslots written, every byte checked\t")
			for _, r := range res.Rows {
				fmt.Fprintf(w, "%d\t%d\t\n", r.Batch, r.TargetChecked)
			}
		case sideAtomic:
			fmt.Fprintln(w, "batch\tword after\t")
			for _, r := range res.Rows {
				fmt.Fprintf(w, "%d\t%d\t\n", r.Batch, r.Word)
			}
		default:
			fmt.Fprintln(w, "batch\t")
			for _, r := range res.Rows {
				fmt.Fprintf(w, "%d\t\n", r.Batch)
			}
		}
		return w.Flush()
	}
	inFlight := inFlight(res.Window, "operations", "initiator", res.SenderSpins, "")
	fmt.Fprintf(e.out, "RC %s bench, %d bytes per operation, %s, at most %s, the target posting nothing; latency: %s\n",
		res.Operation, res.Size, res.Mode, inFlight, res.Latency)
	fmt.Fprintf(w, "batch\toperations\tops/s\tp50 µs\tp99 µs\tdoorbells/op\tpost µs/op\tpoll µs/op\twait µs/op\t%s\t\n", what)
	for _, r := range res.Rows {
		fmt.Fprintf(w, "%d\t%d\t%.0f\t%.1f\t%.1f\t%.3f\t%.2f\t%.2f\t%.2f\t", r.Batch, r.Messages, r.MessagesPerSec, r.P50US, r.P99US, r.DoorbellsPerMsg, r.PostUSPerMsg, r.PollUSPerMsg, r.WaitUSPerMsg)
		switch sided {
		case sideWrite:
			if res.Mode == "initiator" {
				fmt.Fprint(w, "at the target\t\n")
				break
			}
			fmt.Fprintf(w, "%d\t\n", r.TargetChecked)
		case sideRead:
			fmt.Fprintf(w, "%d\t\n", r.Checked)
		case sideAtomic:
			fmt.Fprintf(w, "%d\t%d\t\n", r.Checked, r.Word)
		}
	}
	return w.Flush()
}

// readPingpong is pingpong --read: this end (a; the client between hosts)
// READs slot i%depth of the other end's buffer at iteration i, into its
// own slot zeroed before, and checks every byte. A READ is a round trip
// on the wire by itself (as in ib_read_lat); the other end posts nothing
// and waits for the reader to be done.
func readPingpong(ctx context.Context, e *env, t *trafficFlags, a *endpoint, x exchanger, iters int, stall time.Duration) error {
	if x != nil {
		if err := x.barrier(ctx, "pingpong-ready"); err != nil {
			return err
		}
	}
	r := pingpongResult{Transport: vfrdma.RC.String(), Operation: vfrdma.OpRDMARead.String(), Size: t.size, Wait: t.waitMode()}
	if x != nil && x.server() {
		r.Role = "target"
	} else {
		el, err := readLoop(ctx, t, a, iters, stall)
		if err != nil {
			return err
		}
		r.Iters, r.Seconds, r.Checked = iters, el.Seconds(), true
		r.RoundTripUS = float64(el.Microseconds()) / float64(iters)
		r.MbitPerSec = float64(t.size*iters*8) / el.Seconds() / 1e6
	}
	if x != nil {
		if err := x.barrier(ctx, "pingpong-done"); err != nil {
			return err
		}
	}
	if e.json {
		return e.printJSON(r)
	}
	if r.Role == "target" {
		_, err := fmt.Fprintf(e.out, "RC pingpong (RDMA READ) target, %d-byte slots: this end posted nothing (the other end reports)\n", t.size)
		return err
	}
	_, err := fmt.Fprintf(e.out, "RC pingpong (RDMA READ): %d READs of %d bytes in %.2f s: %.1f µs per READ (a round trip), %.2f Mbit/s, every byte checked\n",
		iters, t.size, r.Seconds, r.RoundTripUS, r.MbitPerSec)
	return err
}

// readLoop posts the READs one at a time and checks each.
func readLoop(ctx context.Context, t *trafficFlags, a *endpoint, iters int, stall time.Duration) (time.Duration, error) {
	op := newRemoteOp(a)
	wait := t.wait()
	wcs := make([]vfrdma.WC, 1)
	var wr [1]vfrdma.SendWR
	var sge [1]vfrdma.SGE
	var progress atomic.Int64
	sctx, stop := perf.WatchQuiet(ctx, &progress, stall)
	defer stop()
	start := time.Now()
	for i := 0; i < iters; i++ {
		a.sendWR(&wr[0], sge[:], uint64(i), i%a.depth, t.size)
		op.fill(&wr[0], i)
		if _, err := a.qp.PostSend(wr[:], 0); err != nil {
			return 0, err
		}
		_, err := wait.Next(sctx, a.cq, wcs)
		if err != nil && perf.Quiet(sctx) && ctx.Err() == nil {
			return 0, stalled(a, stall, i, 0, i)
		}
		if err != nil {
			return 0, err
		}
		progress.Store(int64(i + 1))
		switch wc := &wcs[0]; {
		case wc.Status != vfrdma.WCSuccess:
			return 0, fmt.Errorf("READ %d: completion %+v", i, *wc)
		case wc.WRID != uint64(i):
			return 0, fmt.Errorf("READ %d: completion of request %d", i, wc.WRID)
		default:
			if err := op.done(wc); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}
