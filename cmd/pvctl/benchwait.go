package main

import (
	"github.com/vfrdma/vfrdma/internal/perf"
)

// Receiver modes of pvctl bench. Inline (the default) is the send bench:
// in loopback one loop polls both ends; between hosts the receiver polls,
// and with --events sleeps on its CQ (CQ.WaitN). Spin and wait run the
// receiver as a loop of its own whose CPU time is reported: spin polls
// its CQ without ever sleeping, wait sleeps on a wait set (event.WaitSet
// of kind FD, an eventfd) whenever its CQ is empty.
const (
	recvInline = "inline"
	recvSpin   = "spin"
	recvWait   = "wait"
)

// recvWaitOf is how a receiver of mode waits (perf.Receive.Wait).
func recvWaitOf(mode string, t *trafficFlags) perf.Wait {
	switch mode {
	case recvSpin:
		return perf.Spin
	case recvWait:
		return perf.WaitSet
	}
	return t.wait()
}

// The scope of the receiver's CPU figures (benchResult.ReceiverCPU).
const (
	cpuScopeProcess  = "process"
	cpuScopeLoopback = "process, sender included"
)

// addReceiver puts the receiver's figures into a bench row.
func (row *benchRow) addReceiver(mode string, r perf.RecvResult) {
	row.Receiver = mode
	row.ReceivesChecked = r.Got
	row.ReceiverCPUUSPerMsg = perf.PerMessage(r.CPU.Total(), r.Got)
	if r.Elapsed > 0 {
		row.ReceiverCPUPercent = 100 * r.CPU.Total().Seconds() / r.Elapsed.Seconds()
		row.ReceiverMsgPerSec = perf.Rate(r.Got, r.Elapsed)
	}
	if r.Got > 0 {
		row.WakeupsPerMsg = float64(r.Wakeups) / float64(r.Got)
		row.EmptyPollsPerMsg = float64(r.Empty) / float64(r.Got)
	}
}

// cpuScopeNote says in words whose CPU time the receiver figures are.
func cpuScopeNote(scope string) string {
	switch scope {
	case cpuScopeLoopback:
		return "the whole process (getrusage RUSAGE_SELF), sender included: in loopback the receiver is a goroutine beside it; wake-ups are WaitSet.Wait calls"
	case cpuScopeProcess:
		return "this receiver process (getrusage RUSAGE_SELF); wake-ups are WaitSet.Wait calls"
	}
	return scope
}
