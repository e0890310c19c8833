package vfrdma

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// testHooks are where the host tests watch or steer one Device. Only _test
// files set them (export_test.go); a Device a program opens has none, and
// the Device type itself carries no test knobs. None is on a hot path.
type testHooks struct {
	// onFree is called with each ring's memory where it is released:
	// the tests poison it there, so that a call that touches freed memory
	// is a data race the race detector reports.
	onFree func(mem []byte)
	// drainFor replaces awaitSends' bound, drainLimit, when set.
	drainFor time.Duration
	// drainPause replaces awaitQuietCQs' sleep (of at most drainGrace)
	// when set.
	drainPause func(ctx context.Context, d time.Duration)
	// armGrace, when set (armGraceSet), replaces drainGrace as the time
	// an arm on QEMU counts as pending after its CQE (noneArmedOnDevice).
	armGrace    atomic.Int64
	armGraceSet atomic.Bool
	// dispatched is called on the async-event goroutine with each event,
	// once the driver has acted on it and before it is delivered: a test
	// holds the goroutine there while the ring fills behind it.
	dispatched func(AsyncEvent)
}

// hookTable holds the test hooks by Device (*Device → *testHooks). Only
// _test files write it; it is empty in a program.
var hookTable sync.Map

// hooks returns d's test hooks, or nil.
func (d *Device) hooks() *testHooks {
	if h, ok := hookTable.Load(d); ok {
		return h.(*testHooks)
	}
	return nil
}
