package vfrdma

import "testing"

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
