package ethhub

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A NIC as QEMU's stream netdev is one: length-prefixed frames.
type nic struct {
	c   net.Conn
	mac [6]byte
}

func dial(t *testing.T, h *Hub, last byte) *nic {
	t.Helper()
	c, err := net.Dial("unix", h.Path())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &nic{c: c, mac: [6]byte{0x52, 0x54, 0, 0, 0, last}}
}

func (n *nic) send(t *testing.T, dst [6]byte, body string) {
	t.Helper()
	require.NoError(t, n.write(dst, body))
}

func (n *nic) write(dst [6]byte, body string) error {
	f := make([]byte, 4+14+len(body))
	binary.BigEndian.PutUint32(f, uint32(14+len(body)))
	copy(f[4:10], dst[:])
	copy(f[10:16], n.mac[:])
	copy(f[18:], body)
	_, err := n.c.Write(f)
	return err
}

// recv returns the next frame's body. The deadline only bounds a hub that
// lost the frame: a loaded host may take seconds to deliver it.
func (n *nic) recv(t *testing.T) string {
	t.Helper()
	b, err := n.read(10 * time.Second)
	require.NoError(t, err, "no frame came")
	return b
}

// recvNone returns "" if no frame comes within 200 ms (what a frame that
// should not come would take, at worst, to show), else the frame's body.
func (n *nic) recvNone(t *testing.T) string {
	t.Helper()
	b, err := n.read(200 * time.Millisecond)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ""
	}
	require.NoError(t, err)
	return b
}

// read reads one frame, waiting at most wait for its header; the body of a
// frame whose header came follows it.
func (n *nic) read(wait time.Duration) (string, error) {
	if err := n.c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return "", err
	}
	var hdr [4]byte
	if _, err := io.ReadFull(n.c, hdr[:]); err != nil {
		return "", err
	}
	if err := n.c.SetReadDeadline(time.Time{}); err != nil {
		return "", err
	}
	f := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(n.c, f); err != nil {
		return "", err
	}
	return string(f[14:]), nil
}

var bcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Broadcasts and unknown destinations go to every other port; once a port
// has sent from a MAC, frames to that MAC go to it alone; nothing comes
// back to its sender.
func TestHubFloodsThenLearns(t *testing.T) {
	h, err := Listen(filepath.Join(t.TempDir(), "eth.sock"))
	require.NoError(t, err)
	defer h.Close()
	a, b, c := dial(t, h, 1), dial(t, h, 2), dial(t, h, 3)
	require.Eventually(t, func() bool { return h.Stats().Ports == 3 }, 5*time.Second, 10*time.Millisecond)

	a.send(t, bcast, "hello all")
	assert.Equal(t, "hello all", b.recv(t))
	assert.Equal(t, "hello all", c.recv(t))
	assert.Empty(t, a.recvNone(t), "no echo to the sender")

	b.send(t, a.mac, "to a") // a's MAC is learnt
	assert.Equal(t, "to a", a.recv(t))
	assert.Empty(t, c.recvNone(t), "a known destination is not flooded")

	c.send(t, [6]byte{0x52, 0x54, 0, 0, 0, 9}, "to nobody known")
	assert.Equal(t, "to nobody known", a.recv(t))
	assert.Equal(t, "to nobody known", b.recv(t))

	s := h.Stats()
	assert.Equal(t, Stats{Ports: 3, Frames: 3, Unicast: 1, Flooded: 2}, s)
}

// A burst bigger than a socket buffer arrives whole and in order: the hub
// holds the sender up rather than drop.
func TestHubIsLossless(t *testing.T) {
	h, err := Listen(filepath.Join(t.TempDir(), "eth.sock"))
	require.NoError(t, err)
	defer h.Close()
	a, b := dial(t, h, 1), dial(t, h, 2)
	b.send(t, bcast, "b is here")
	require.Equal(t, "b is here", a.recv(t))
	const n = 5000
	errs := make(chan error, 1)
	go func() {
		for i := range n {
			if err := a.write(b.mac, string(rune('A'+i%26))+string(make([]byte, 1000))); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	for i := range n {
		got := b.recv(t)
		require.NotEmpty(t, got, "frame %d", i)
		require.Equal(t, string(rune('A'+i%26)), got[:1], "frame %d", i)
	}
	require.NoError(t, <-errs)
}
