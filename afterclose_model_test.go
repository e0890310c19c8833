package vfrdma_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// AfterClose's functions run once Close has released the device, even
// one that raised DEVICE_FATAL and refused every destroy: on Close's
// goroutine, in the order registered, before Close returns; the device
// then maps nothing, and an object's Close there returns nil (no wait on
// the Close under way).
func TestAfterCloseFunctionsRunInOrderOnceTheDeviceIsReleasedBeforeCloseReturns(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	mr, err := pd.RegisterMR(ctx, mem, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, m.Fatal())
	require.Error(t, mr.Close(), "the dead device refuses the deregistration")

	var ran []int
	var dma pvsim.DMAUse
	var mrErr error
	d.AfterClose(func() { ran = append(ran, 1); dma = m.DMA(); mrErr = mr.Close() })
	// Enough of them that an order left to chance (a map's) shows.
	want := []int{1}
	for i := 2; i <= 32; i++ {
		d.AfterClose(func() { ran = append(ran, i) })
		want = append(want, i)
	}
	_ = d.Close() // the dead device refuses the destroys
	assert.Equal(t, want, ran, "each ran once, in order, before Close returned")
	assert.Equal(t, pvsim.DMAUse{}, dma, "the device mapped nothing when they ran")
	assert.NoError(t, mrErr, "MR.Close in an AfterClose function")
	require.NoError(t, d.Close())
	assert.Equal(t, want, ran, "a second Close runs none again")
}

// stop unregisters a function: Close does not run it; stop reports
// whether it stopped it.
func TestAfterCloseStopKeepsTheFunctionFromRunning(t *testing.T) {
	d, _ := openModel(t, vmware(20), nil)
	var stopped, kept int
	stop := d.AfterClose(func() { stopped++ })
	stop2 := d.AfterClose(func() { kept++ })
	assert.True(t, stop(), "stopped before Close")
	assert.False(t, stop(), "a second stop")
	require.NoError(t, d.Close())
	assert.Zero(t, stopped)
	assert.Equal(t, 1, kept)
	assert.False(t, stop2(), "a stop after the function ran")
}

// A function registered once Close has run its functions runs at once,
// on a goroutine of its own.
func TestAfterCloseOnAClosedDeviceRunsTheFunctionAtOnce(t *testing.T) {
	d, _ := openModel(t, vmware(20), nil)
	require.NoError(t, d.Close())
	ran := make(chan struct{})
	stop := d.AfterClose(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(time.Minute): // a hang guard only
		require.FailNow(t, "the function did not run")
	}
	assert.False(t, stop())
}

// A second Close racing the first returns only once the first has run
// the AfterClose functions: whoever's Close returns may count on them.
func TestASecondDeviceCloseReturnsAfterTheAfterCloseFunctions(t *testing.T) {
	d, _ := openModel(t, vmware(20), nil)
	started := make(chan struct{})
	second := make(chan struct{})
	var mu sync.Mutex
	early := false
	d.AfterClose(func() {
		close(started)
		// Long enough for a second Close that does not wait to return.
		select {
		case <-second:
			mu.Lock()
			early = true
			mu.Unlock()
		case <-time.After(200 * time.Millisecond):
		}
	})
	first := make(chan error, 1)
	go func() { first <- d.Close() }()
	<-started
	assert.NoError(t, d.Close())
	close(second)
	require.NoError(t, <-first)
	mu.Lock()
	defer mu.Unlock()
	assert.False(t, early, "the second Close returned while the functions ran")
}
