package vfrdma

import (
	"testing"
	"time"
)

// setTestHooks gives d the hooks h until the test ends.
func setTestHooks(t testing.TB, d *Device, h *testHooks) {
	t.Helper()
	hookTable.Store(d, h)
	t.Cleanup(func() { hookTable.Delete(d) })
}

// HookAsyncDispatch calls f on d's async-event goroutine with each event,
// once the driver has acted on it and before it is delivered, until the
// test ends: the external tests hold the goroutine there.
func HookAsyncDispatch(t testing.TB, d *Device, f func(AsyncEvent)) {
	t.Helper()
	setTestHooks(t, d, &testHooks{dispatched: f})
}

// SetArmSpentGrace makes d count an arm on QEMU's device as pending for g
// after its CQE (instead of drainGrace), until the test ends; it can be
// called again to change g.
func SetArmSpentGrace(t testing.TB, d *Device, g time.Duration) {
	t.Helper()
	h := d.hooks()
	if h == nil {
		h = &testHooks{}
		setTestHooks(t, d, h)
	}
	h.armGrace.Store(int64(g))
	h.armGraceSet.Store(true)
}
