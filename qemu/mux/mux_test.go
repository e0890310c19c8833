package mux

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vfrdma/vfrdma/qemu/fabric"
)

func request(op uint32, gid fabric.GID) []byte {
	m := make([]byte, MsgSize)
	binary.LittleEndian.PutUint32(m[offOpCode:], op)
	copy(m[offGID:], gid[:])
	m[MsgSize-1] = 0xaa // payload bytes are echoed untouched
	return m
}

func roundTrip(t *testing.T, c net.Conn, m []byte) []byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, MsgSize)
	if _, err := io.ReadFull(c, r); err != nil {
		t.Fatal(err)
	}
	if typ := binary.LittleEndian.Uint32(r[offMsgType:]); typ != MsgResponse {
		t.Fatalf("msg_type = %d, want response", typ)
	}
	if r[MsgSize-1] != 0xaa {
		t.Fatal("payload not echoed")
	}
	return r
}

func errCode(r []byte) uint32 { return binary.LittleEndian.Uint32(r[offErrCode:]) }

func TestRegisterThroughSocket(t *testing.T) {
	dir := t.TempDir()
	fab := fabric.Dir(filepath.Join(dir, "fabric"))
	s, err := Listen(filepath.Join(dir, "mux.sock"), fab, "vm0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	g := fabric.GID{0xfe, 0x80, 15: 0x42}
	if r := roundTrip(t, c, request(OpReg, g)); errCode(r) != ErrOK {
		t.Fatalf("REG err_code %d", errCode(r))
	}
	if owner, err := fab.Owner(g); err != nil || owner != "vm0" {
		t.Fatalf("after REG: owner %q, %v", owner, err)
	}
	if tab, _ := fab.Table("vm0"); tab[fabric.FirstIndex] != g {
		t.Fatalf("table %v", tab)
	}
	if got := s.GIDs(); len(got) != 1 || got[0] != g {
		t.Fatalf("GIDs() = %v", got)
	}
	if r := roundTrip(t, c, request(OpMAD, g)); errCode(r) != ErrNotFound {
		t.Fatalf("MAD err_code %d, want %d", errCode(r), ErrNotFound)
	}
	if r := roundTrip(t, c, request(7, g)); errCode(r) != ErrEINVAL {
		t.Fatalf("unknown op err_code %d", errCode(r))
	}
	if r := roundTrip(t, c, request(OpUnreg, g)); errCode(r) != ErrOK {
		t.Fatalf("UNREG err_code %d", errCode(r))
	}
	if _, err := fab.Owner(g); err == nil {
		t.Fatal("route survived UNREG")
	}
	st := s.Stats()
	if st.Regs != 1 || st.Unregs != 1 || st.MADs != 1 || st.Bad != 1 || st.Conns != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseDropsClients(t *testing.T) {
	dir := t.TempDir()
	s, err := Listen(filepath.Join(dir, "m.sock"), fabric.Dir(dir), "n", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(10 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Close() // idempotent
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("client still connected after Close")
	}
}
