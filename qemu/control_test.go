package qemu

import (
	"bufio"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

func dialControl(t *testing.T, path string) (net.Conn, *bufio.Scanner) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewScanner(c)
}

func ask(t *testing.T, c net.Conn, sc *bufio.Scanner, req proto.Request) proto.Reply {
	t.Helper()
	b, _ := json.Marshal(req)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	if !sc.Scan() {
		t.Fatalf("no reply to %+v: %v", req, sc.Err())
	}
	var rep proto.Reply
	if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// Two VMs' channels share one store: a get in one waits for a put in the other.
func TestControlRendezvous(t *testing.T) {
	dir := t.TempDir()
	kv := newRendezvous()
	defer kv.close()
	a, err := listenControl(filepath.Join(dir, "a.ctl"), kv, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	b, err := listenControl(filepath.Join(dir, "b.ctl"), kv, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	ca, sa := dialControl(t, a.path)
	cb, sb := dialControl(t, b.path)

	got := make(chan proto.Reply, 1)
	go func() { got <- ask(t, cb, sb, proto.Request{Op: proto.OpGet, Key: "qpn/0", TimeoutMS: 3000}) }()
	time.Sleep(50 * time.Millisecond)
	if rep := ask(t, ca, sa, proto.Request{Op: proto.OpPut, Key: "qpn/0", Value: "17"}); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if rep := <-got; rep.Value != "17" || rep.Error != "" {
		t.Fatalf("get = %+v", rep)
	}
	// Same value again is fine; a different one is refused.
	if rep := ask(t, ca, sa, proto.Request{Op: proto.OpPut, Key: "qpn/0", Value: "17"}); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if rep := ask(t, ca, sa, proto.Request{Op: proto.OpPut, Key: "qpn/0", Value: "18"}); !strings.Contains(rep.Error, "already") {
		t.Fatalf("overwrite: %+v", rep)
	}
	if rep := ask(t, ca, sa, proto.Request{Op: proto.OpGet, Key: "never", TimeoutMS: 50}); !strings.Contains(rep.Error, "nobody put it") {
		t.Fatalf("timeout: %+v", rep)
	}
	if rep := ask(t, ca, sa, proto.Request{Op: "frob"}); !strings.Contains(rep.Error, "unknown op") {
		t.Fatalf("bad op: %+v", rep)
	}
	c, s := dialControl(t, b.path) // a reconnect replaces the old connection
	if _, err := c.Write([]byte("{not json\n")); err != nil {
		t.Fatal(err)
	}
	if !s.Scan() || !strings.Contains(s.Text(), "bad request") {
		t.Fatalf("bad json: %q", s.Text())
	}
}

// OpKill calls the VM's killer and sends no reply; a channel without a
// killer refuses it.
func TestControlKillCallsTheKillerAndNeverReplies(t *testing.T) {
	dir := t.TempDir()
	kv := newRendezvous()
	defer kv.close()
	killed := make(chan struct{})
	a, err := listenControl(filepath.Join(dir, "a.ctl"), kv, discard(), func() { close(killed) })
	require.NoError(t, err)
	defer a.close()
	c, sc := dialControl(t, a.path)
	b, _ := json.Marshal(proto.Request{Op: proto.OpKill})
	_, err = c.Write(append(b, '\n'))
	require.NoError(t, err)
	select {
	case <-killed:
	case <-time.After(5 * time.Second):
		t.Fatal("the killer was not called")
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	assert.False(t, sc.Scan(), "a reply came: %q", sc.Text())

	n, err := listenControl(filepath.Join(dir, "n.ctl"), kv, discard(), nil)
	require.NoError(t, err)
	defer n.close()
	cn, sn := dialControl(t, n.path)
	rep := ask(t, cn, sn, proto.Request{Op: proto.OpKill})
	assert.Contains(t, rep.Error, "cannot kill")
}
