// Package proto is the wire format between the guest and the host runner of
// the test bench.
//
// Two channels cross the VM boundary:
//
//   - The console (the guest's ttyS0, the QEMU process's stdio). The guest init
//     writes one Record per line, each line starting with Prefix and followed
//     by the record as JSON. Everything else on the console (kernel messages)
//     is kept only as a capped tail for diagnosis.
//   - The control channel (the guest's ttyS1, a unix socket on the host). A
//     line-oriented JSON request/reply protocol that in-guest tests use to
//     exchange values (QP numbers, GIDs) with tests in other VMs of the same
//     run, through a key/value rendezvous kept by the host.
//
// The types here are plain data; both sides encode and decode them with
// encoding/json. Nothing here does I/O.
package proto

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Prefix starts every record line on the console.
const Prefix = "@@vfrdma "

// Record events.
const (
	EventStart = "start" // a program started
	EventOut   = "out"   // one line of a program's output
	EventTest  = "test"  // one Go test finished (from a -test.v run)
	EventExit  = "exit"  // a program exited
	EventError = "error" // the init itself failed at something (module load, bind)
	EventDone  = "done"  // the init has finished; the VM may be killed
)

// Test statuses.
const (
	StatusPass = "pass"
	StatusFail = "fail"
	StatusSkip = "skip"
)

// Output streams of an EventOut record. A plain program's stdout and stderr
// reach the host apart, each in its own order (the order between the two
// is not kept); a Go test binary's two streams are read as one, in the
// order written, and reported as stdout.
const (
	StreamStdout = ""       // the program's standard output
	StreamStderr = "stderr" // its standard error
)

// Record is one line the guest init writes on the console.
type Record struct {
	Event   string  `json:"event"`
	Prog    string  `json:"prog,omitempty"`
	Line    string  `json:"line,omitempty"`    // EventOut
	Stream  string  `json:"stream,omitempty"`  // EventOut: StreamStdout or StreamStderr
	Test    string  `json:"test,omitempty"`    // EventTest
	Status  string  `json:"status,omitempty"`  // EventTest
	Elapsed float64 `json:"elapsed,omitempty"` // EventTest, EventExit: seconds
	Code    int     `json:"code"`              // EventExit: exit status (-1: did not run or was killed)
	Msg     string  `json:"msg,omitempty"`     // EventError, EventExit: why
}

// Encode returns r as one console line, Prefix included, newline included.
func (r Record) Encode() []byte {
	b, err := json.Marshal(r)
	if err != nil { // a struct of strings and numbers cannot fail to marshal
		panic(err)
	}
	out := make([]byte, 0, len(Prefix)+len(b)+1)
	out = append(out, Prefix...)
	out = append(out, b...)
	return append(out, '\n')
}

// Parse finds a record in one console line. ok is false for lines that are
// not records (kernel output); err is set for a record line that does not
// decode. Text before Prefix on the same line (a kernel message that raced
// the record) is ignored.
func Parse(line []byte) (r Record, ok bool, err error) {
	i := bytes.Index(line, []byte(Prefix))
	if i < 0 {
		return Record{}, false, nil
	}
	body := bytes.TrimRight(line[i+len(Prefix):], "\r\n")
	if err := json.Unmarshal(body, &r); err != nil {
		return Record{}, true, fmt.Errorf("proto: bad record %q: %w", body, err)
	}
	if r.Event == "" {
		return Record{}, true, fmt.Errorf("proto: record without event: %q", body)
	}
	return r, true, nil
}

// Control-channel operations.
const (
	OpPut = "put" // store Value under Key (a key is written once per run)
	OpGet = "get" // wait until Key has a value, then return it
	// OpKill asks the host to kill this VM's QEMU at once (SIGKILL), as a
	// crash would: tests use it to see what the other VMs of the run get
	// when a peer dies in mid-transfer. No reply ever comes; the VM's
	// result says it was killed on request, which is not a failure.
	OpKill = "kill"
	// OpSetLink sets the link of this VM's Ethernet function (its netdev,
	// through QEMU's monitor) up (Value "up") or down ("down"), as a cable
	// pulled and plugged back: tests use it for link-change events.
	OpSetLink = "set_link"
)

// Request is one line a guest sends on the control channel.
type Request struct {
	Op        string `json:"op"`
	Key       string `json:"key"`
	Value     string `json:"value,omitempty"`
	TimeoutMS int    `json:"timeout_ms,omitempty"` // OpGet: how long the host may wait (0: the host's default)
}

// Reply answers one Request, in order.
type Reply struct {
	Value string `json:"value,omitempty"`
	Error string `json:"error,omitempty"`
}

// Guest-side conventions shared by the init, the runner and in-guest tests.
const (
	// ConsoleDevice and ControlDevice are the guest's serial ports.
	ConsoleDevice = "/dev/ttyS0"
	ControlDevice = "/dev/ttyS1"

	// ManifestPath is where the initramfs keeps what the init must run.
	ManifestPath = "/etc/vfrdma/manifest.json"

	// Kernel command-line keys the runner sets per VM.
	CmdlineVM  = "vfrdma.vm"  // this VM's index in the run, from 0
	CmdlineVMs = "vfrdma.vms" // how many VMs the run has

	// Environment the init gives every program it runs.
	EnvGuest = "VFRDMA_GUEST" // "1" inside the bench's guest
	EnvBDF   = "VFRDMA_BDF"   // the pvrdma function, e.g. 0000:00:10.1
	EnvVM    = "VFRDMA_VM"    // this VM's index
	EnvVMs   = "VFRDMA_VMS"   // VMs in the run
)

// The bench's networks. Every VM's vmxnet3 function (the "eth" network) and,
// in runs of several VMs, a virtio-net NIC on the management network (the
// "mgmt" network: TCP between guests, as a cluster's management network),
// with addresses fixed by the VM's index.
const (
	NetEth  = "eth"
	NetMgmt = "mgmt"
)

// NetMAC returns VM vm's MAC on network net.
func NetMAC(net string, vm int) string {
	if net == NetMgmt {
		return fmt.Sprintf("52:54:00:99:00:%02x", vm)
	}
	return fmt.Sprintf("52:54:00:12:34:%02x", 0x56+vm)
}

// NetAddr returns VM vm's IPv4 address with its prefix on network net:
// 192.168.100.(vm+1)/24 on mgmt, 10.10.0.(vm+1)/24 on eth.
func NetAddr(net string, vm int) string {
	if net == NetMgmt {
		return fmt.Sprintf("192.168.100.%d/24", vm+1)
	}
	return fmt.Sprintf("10.10.0.%d/24", vm+1)
}
