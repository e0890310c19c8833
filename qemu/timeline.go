package qemu

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CQEKind is DeviceEvent.Kind of a completion the device wrote into a CQ
// (the other kinds are doorbells, "QP SEND", "CQ POLL", ...).
const CQEKind = "CQE"

// The work-completion opcodes of a CQE that the timeline tells apart
// (the device's, which are the verbs' own).
const (
	CQESend = 0   // a send's completion
	CQERecv = 128 // a receive's completion
)

// DeviceEvent is one thing a VM's pvrdma device did, as QEMU traced it:
// a doorbell the guest rang, or a CQE the device wrote.
type DeviceEvent struct {
	At     time.Time // the host's clock (microseconds)
	Thread int       // the host thread that ran it: the vCPU's, or the device's completion thread
	// Kind is the doorbell's class and operation ("QP SEND", "QP RECV",
	// "CQ POLL", "CQ ARM", ...) or CQEKind.
	Kind string
	// Obj is a doorbell's QP or CQ handle, or a CQE's CQ handle.
	Obj uint32
	// A CQE's fields.
	Opcode  int
	Status  int
	ByteLen int
	QPN     uint32
	WRID    uint64
}

// readTimeline reads a trace log written with Options.Timeline: lines
// "TID@SEC.USEC:EVENT ARGS". A line of another shape is skipped (QEMU
// writes other messages to the same log); a traced event whose fields do
// not parse is an error, so a QEMU whose trace format changed is not
// read as an empty timeline.
func readTimeline(path string) ([]DeviceEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []DeviceEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		ev, ok, err := parseTraceLine(sc.Text())
		if err != nil {
			return evs, fmt.Errorf("bench: %s line %d: %w", path, n, err)
		}
		if ok {
			evs = append(evs, ev)
		}
	}
	return evs, sc.Err()
}

// parseTraceLine reads one line of the log: ok is false for a line that
// is not one of the two traced events.
func parseTraceLine(line string) (ev DeviceEvent, ok bool, err error) {
	head, rest, found := strings.Cut(line, ":")
	if !found {
		return ev, false, nil
	}
	tid, stamp, found := strings.Cut(head, "@")
	if !found {
		return ev, false, nil
	}
	name, args, _ := strings.Cut(rest, " ")
	if name != "pvrdma_uar_write" && name != "pvrdma_post_cqe" {
		return ev, false, nil
	}
	if ev.Thread, err = strconv.Atoi(tid); err != nil {
		return ev, false, fmt.Errorf("thread %q: %w", tid, err)
	}
	secs, frac, found := strings.Cut(stamp, ".")
	s, err1 := strconv.ParseInt(secs, 10, 64)
	u, err2 := strconv.ParseInt(frac, 10, 64)
	if !found || len(frac) != 6 || err1 != nil || err2 != nil {
		return ev, false, fmt.Errorf("time stamp %q: want SECONDS.MICROSECONDS", stamp)
	}
	ev.At = time.Unix(s, u*1000)
	if name == "pvrdma_uar_write" {
		// "uar[0x0]=0x40000010 (cls=QP, op=SEND, obj=16, val=0)"
		_, kv, found := strings.Cut(args, "(")
		kv = strings.TrimSuffix(kv, ")")
		f := fields(kv)
		obj, err := strconv.ParseUint(f["obj"], 10, 32)
		if !found || f["cls"] == "" || f["op"] == "" || err != nil {
			return ev, false, fmt.Errorf("doorbell %q: want (cls=C, op=O, obj=N, ...)", args)
		}
		ev.Kind, ev.Obj = f["cls"]+" "+f["op"], uint32(obj)
		return ev, true, nil
	}
	// "cq_handle=0, notify=0, wr_id=0x2c, qpn=0x10, opcode=0, status=0, byte_len=64, ..."
	f := fields(args)
	ev.Kind = CQEKind
	var nums [6]uint64
	for i, k := range []string{"cq_handle", "opcode", "status", "byte_len", "qpn", "wr_id"} {
		v, err := strconv.ParseUint(f[k], 0, 64)
		if err != nil {
			return ev, false, fmt.Errorf("CQE %q: field %s: %w", args, k, err)
		}
		nums[i] = v
	}
	ev.Obj, ev.Opcode, ev.Status, ev.ByteLen = uint32(nums[0]), int(nums[1]), int(nums[2]), int(nums[3])
	ev.QPN, ev.WRID = uint32(nums[4]), nums[5]
	return ev, true, nil
}

// fields splits "k=v, k=v" into a map.
func fields(s string) map[string]string {
	m := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		m[k] = v
	}
	return m
}
