package vmxnet3

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzRecvCompletion: whatever the device writes in a receive completion
// (descriptor index, ring, flags, length, error bit), Recv neither panics
// nor reads outside its buffers: it delivers a frame no longer than the
// buffer it came in, or stops with ErrDeviceFault (or ErrShortBuffer for a
// caller buffer too small), and a later call still works.
func FuzzRecvCompletion(f *testing.F) {
	f.Add(uint32(0|rxcSOP|rxcEOP), uint32(0), uint32(100), uint8(0), uint16(1514))
	f.Add(uint32(5|rxcSOP|rxcEOP), uint32(0), uint32(100), uint8(5), uint16(1514))            // the right index after 5 frames
	f.Add(uint32(7|rxcSOP|rxcEOP), uint32(0), uint32(100), uint8(5), uint16(1514))            // the wrong one
	f.Add(uint32(0|rxcSOP|rxcEOP|1<<rxcRqShift), uint32(0), uint32(60), uint8(0), uint16(60)) // ring 1
	f.Add(uint32(0|rxcSOP|rxcEOP), uint32(0), uint32(rxLenMask), uint8(0), uint16(1514))      // longer than the buffer
	f.Add(uint32(0|rxcSOP|rxcEOP), uint32(0), uint32(3000|rxcErr), uint8(1), uint16(1514))    // truncated
	f.Add(uint32(0xFFFFFFFF), uint32(0xFFFFFFFF), uint32(0xFFFFFFFF), uint8(31), uint16(0))
	f.Fuzz(func(t *testing.T, w0, w1, w2 uint32, before uint8, bufLen uint16) {
		n, dev := newTestNIC(t, &Options{RxRing: 32})
		bufs, sizes := [][]byte{make([]byte, 1514)}, []int{0}
		for i := range int(before % 32) { // move the rings along first
			dev.deliver(frame(60+i, byte(i)))
			got, err := n.Recv(bufs, sizes)
			require.NoError(t, err)
			require.Equal(t, 1, got)
		}
		// The device's forged completion, generation bit last.
		r := &n.rx
		c := r.comp[r.compNext*descSize : r.compNext*descSize+descSize]
		binary.LittleEndian.PutUint32(c[0:], w0)
		binary.LittleEndian.PutUint32(c[4:], w1)
		binary.LittleEndian.PutUint32(c[8:], w2)
		atomicStore32(c[12:], r.compGen)
		small := [][]byte{make([]byte, bufLen)}
		for range 2 {
			got, err := n.Recv(small, sizes)
			if err != nil {
				assert.True(t, errors.Is(err, ErrDeviceFault) || errors.Is(err, ErrShortBuffer), "%v", err)
				assert.Zero(t, got)
				continue
			}
			if got == 1 {
				assert.LessOrEqual(t, sizes[0], len(small[0]))
				assert.LessOrEqual(t, sizes[0], r.bufSize)
			}
		}
		assert.Less(t, r.fill, r.size)
		assert.Less(t, r.compNext, r.compSize)
	})
}

// FuzzSendCompletion: whatever descriptor index the device writes in a
// transmit completion, Send neither panics nor loses count of what is in
// flight: a completion that names another descriptor than the oldest in
// flight is ErrDeviceFault and completes nothing.
func FuzzSendCompletion(f *testing.F) {
	f.Add(uint32(0), uint8(1), uint8(0))
	f.Add(uint32(3), uint8(4), uint8(3))
	f.Add(uint32(31), uint8(1), uint8(0))
	f.Add(uint32(0xFFFFFFFF), uint8(32), uint8(31))
	f.Fuzz(func(t *testing.T, w0 uint32, inFlight, done uint8) {
		n, dev := newTestNIC(t, &Options{TxRing: 32})
		dev.discard = true
		// done frames sent and completed, then inFlight held by the device.
		k := int(done % 32)
		for range k {
			_, err := n.Send([][]byte{frame(60, 1)})
			require.NoError(t, err)
		}
		dev.hold = true
		m := int(inFlight%32) + 1
		for range m {
			_, err := n.Send([][]byte{frame(60, 2)})
			require.NoError(t, err)
		}
		tx := &n.tx
		require.Equal(t, m, tx.inFlight)
		c := tx.comp[tx.compNext*descSize : tx.compNext*descSize+descSize]
		binary.LittleEndian.PutUint32(c[0:], w0)
		atomicStore32(c[12:], tx.compGen)
		oldest := tx.done
		_, err := n.Send(nil)
		if w0&txCompIdx == oldest {
			require.NoError(t, err)
			assert.Equal(t, m-1, tx.inFlight)
		} else {
			assert.ErrorIs(t, err, ErrDeviceFault)
			assert.Equal(t, m, tx.inFlight, "a bad completion completes nothing")
		}
		assert.Less(t, tx.done, tx.size)
		assert.LessOrEqual(t, tx.inFlight, int(tx.size))
	})
}

// The length a receive completion names is checked against the ring's
// buffer before anything is copied: exactly the buffer's size is a frame,
// one byte more is ErrDeviceFault, though the caller's buffer could hold
// it (nothing is read past the ring buffer into the next one).
func TestRecvTakesACompletionOfExactlyTheRingBufferAndFaultsOneByteMore(t *testing.T) {
	for _, tc := range []struct {
		extra int
		fault bool
	}{{0, false}, {1, true}} {
		n, _ := newTestNIC(t, &Options{RxRing: 32})
		r := &n.rx
		length := r.bufSize + tc.extra
		c := r.comp[r.compNext*descSize : r.compNext*descSize+descSize]
		binary.LittleEndian.PutUint32(c[0:], uint32(r.fill)|rxcSOP|rxcEOP)
		binary.LittleEndian.PutUint32(c[4:], 0)
		binary.LittleEndian.PutUint32(c[8:], uint32(length))
		atomicStore32(c[12:], r.compGen)
		bufs, sizes := [][]byte{make([]byte, 2*r.bufSize)}, []int{0}
		got, err := n.Recv(bufs, sizes)
		if tc.fault {
			assert.ErrorIs(t, err, ErrDeviceFault, "a %d-byte frame in a %d-byte ring buffer", length, r.bufSize)
			assert.Zero(t, got)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, 1, got)
		assert.Equal(t, length, sizes[0])
	}
}
