//go:build guest

package vmxnet3_test

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/qemu/proto"
	"github.com/vfrdma/vfrdma/vmxnet3"
)

func guestBDF(t testing.TB) string {
	t.Helper()
	if os.Getenv(proto.EnvGuest) != "1" {
		t.Skip("in-guest test: run it on the bench with `go run ./cmd/pvvm -test vmxnet3` (or `make test`)")
	}
	bdf := os.Getenv(proto.EnvBDF)
	require.NotEmpty(t, bdf, "%s is not set: the bench's init did not find the pvrdma function", proto.EnvBDF)
	return bdf
}

// noFault runs f with memory faults turned into panics and reports one as
// an error, so that a call reading unmapped memory fails the test rather
// than killing the test binary.
func noFault(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault: %v", r)
		}
	}()
	f()
	return nil
}

// testFrame is a broadcast frame of an experimental EtherType: the user
// network drops it.
func testFrame(src []byte) []byte {
	f := make([]byte, 60)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], src)
	f[12], f[13] = 0x88, 0xb5
	return f
}

// Device.Ethernet() after Device.Close: every call returns ErrClosed (Send
// faulted in checkLink, reading the shared area Close had unmapped).
func TestEthernetCallsAfterDeviceCloseReturnErrClosed(t *testing.T) {
	d, err := vfrdma.Open(guestBDF(t), nil)
	require.NoError(t, err)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	require.NoError(t, d.Close())
	bufs, sizes := [][]byte{make([]byte, eth.MaxFrame())}, []int{0}
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Send":           func() error { _, err := eth.Send([][]byte{testFrame(eth.MAC())}); return err },
		"Recv":           func() error { _, err := eth.Recv(bufs, sizes); return err },
		"RecvWait":       func() error { _, err := eth.RecvWait(ctx, bufs, sizes); return err },
		"Link":           func() error { _, err := eth.Link(); return err },
		"WaitLinkChange": func() error { _, _, err := eth.WaitLinkChange(ctx, 0); return err },
		"Stats":          func() error { _, err := eth.Stats(); return err },
	} {
		var err error
		require.NoError(t, noFault(func() { err = call() }), name)
		assert.ErrorIs(t, err, vmxnet3.ErrClosed, name)
	}
	assert.NoError(t, eth.Close(), "the NIC's own Close after the device's")
}

// Device.Close while a sender, a receiver asleep in RecvWait and a control
// caller run: each ends with ErrClosed, none faults, Close returns.
func TestEthernetDeviceCloseRacingCalls(t *testing.T) {
	bdf := guestBDF(t)
	for round := range 8 {
		d, err := vfrdma.Open(bdf, nil)
		require.NoError(t, err)
		eth := d.Ethernet()
		require.NotNil(t, eth)
		var wg sync.WaitGroup
		run := func(what string, op func() error) {
			wg.Go(func() {
				assert.NoError(t, noFault(func() {
					for {
						if err := op(); err != nil {
							assert.ErrorIs(t, err, vmxnet3.ErrClosed, "round %d: %s", round, what)
							return
						}
					}
				}), "round %d: %s", round, what)
			})
		}
		frames := [][]byte{testFrame(eth.MAC()), testFrame(eth.MAC())}
		run("Send", func() error { _, err := eth.Send(frames); return err })
		bufs, sizes := [][]byte{make([]byte, eth.MaxFrame())}, []int{0}
		run("RecvWait", func() error { _, err := eth.RecvWait(context.Background(), bufs, sizes); return err })
		run("Link and Stats", func() error {
			if _, err := eth.Link(); err != nil {
				return err
			}
			_, err := eth.Stats()
			return err
		})
		// Let the goroutines get going: a few sends through the device.
		for s := uint64(0); s < uint64(round+1)*8; {
			st, err := eth.Stats()
			require.NoError(t, err)
			s = st.TxFrames
		}
		require.NoError(t, noFault(func() { assert.NoError(t, d.Close()) }), "round %d: Device.Close", round)
		wg.Wait()
	}
}
