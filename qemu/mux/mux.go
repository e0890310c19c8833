// Package mux answers QEMU's MAD multiplexer socket (pvrdma's mad-chardev).
//
// QEMU's pvrdma device connects to this socket at realize and refuses to
// start without it. Every message either way is MsgSize bytes; QEMU blocks
// its vCPU after each request until it reads a reply of the same size. The
// guest's CREATE_BIND arrives as a REG message carrying the new GID, its
// DESTROY_BIND as UNREG; the server registers those GIDs in the software
// backend's fabric (package fabric) for the node that QEMU process is, so the
// backend can resolve and route them. MAD messages (QP1 traffic) have no CM
// peer on the bench: they are answered with an error and dropped.
//
// A Server serves one QEMU process (one node) and is safe for concurrent use.
package mux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"

	"github.com/vfrdma/vfrdma/qemu/fabric"
)

// Message layout (QEMU contrib/rdmacm-mux/rdmacm-mux.h, by offset).
const (
	MsgSize = 360

	offMsgType = 0  // u32: MsgRequest or MsgResponse
	offOpCode  = 4  // u32: OpReg, OpUnreg, OpMAD
	offGID     = 8  // 16 bytes
	offErrCode = 24 // u32: ErrOK, ...
)

// Message types and operation codes.
const (
	MsgRequest  = 0
	MsgResponse = 1

	OpReg   = 0
	OpUnreg = 1
	OpMAD   = 2
)

// Error codes a response carries.
const (
	ErrOK       = 0
	ErrEINVAL   = 1
	ErrEEXIST   = 2
	ErrEACCES   = 3
	ErrNotFound = 4
)

// Stats counts what a Server has answered.
type Stats struct {
	Conns, Regs, Unregs, MADs, Bad int
}

// Server is a listening mux socket for one node.
type Server struct {
	ln     *net.UnixListener
	path   string
	fabric fabric.Dir
	node   string
	log    *slog.Logger

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	stats Stats
	gids  []fabric.GID
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

// Listen creates the socket at path (replacing a stale one) and starts
// serving in the background. log may be nil.
func Listen(path string, dir fabric.Dir, node string, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("mux: remove stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("mux: %w", err)
	}
	s := &Server{ln: ln, path: path, fabric: dir, node: node, log: log,
		conns: make(map[net.Conn]struct{}), done: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// GIDs returns the GIDs registered through this server and not unregistered.
func (s *Server) GIDs() []fabric.GID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]fabric.GID(nil), s.gids...)
}

// Close stops serving, closes every connection and removes the socket. The
// GIDs stay registered: the node's owner removes them (fabric.RemoveNode).
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		os.Remove(s.path)
	})
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
			default:
				s.log.Error("mux accept", "err", err)
			}
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.stats.Conns++
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	msg := make([]byte, MsgSize)
	for {
		if _, err := io.ReadFull(c, msg); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("mux read", "err", err)
			}
			return
		}
		s.handle(msg)
		if _, err := c.Write(msg); err != nil {
			s.log.Debug("mux write", "err", err)
			return
		}
	}
}

// handle turns the request in msg into its response, in place.
func (s *Server) handle(msg []byte) {
	le := binary.LittleEndian
	var gid fabric.GID
	copy(gid[:], msg[offGID:offGID+16])
	code := uint32(ErrOK)

	s.mu.Lock()
	defer s.mu.Unlock()
	switch typ, op := le.Uint32(msg[offMsgType:]), le.Uint32(msg[offOpCode:]); {
	case typ != MsgRequest:
		s.stats.Bad++
		code = ErrEINVAL
	case op == OpReg:
		s.stats.Regs++
		idx, err := s.fabric.Register(s.node, gid)
		if err != nil {
			s.log.Error("mux: register GID", "node", s.node, "gid", gid, "err", err)
			code = ErrEINVAL
			break
		}
		s.log.Debug("mux: GID registered", "node", s.node, "gid", gid, "index", idx)
		s.gids = append(s.gids, gid)
	case op == OpUnreg:
		s.stats.Unregs++
		if err := s.fabric.Unregister(s.node, gid); err != nil {
			s.log.Error("mux: unregister GID", "node", s.node, "gid", gid, "err", err)
			code = ErrEINVAL
			break
		}
		for i, g := range s.gids {
			if g == gid {
				s.gids = append(s.gids[:i], s.gids[i+1:]...)
				break
			}
		}
	case op == OpMAD:
		s.stats.MADs++
		code = ErrNotFound // no CM peer on the bench
	default:
		s.stats.Bad++
		code = ErrEINVAL
	}
	le.PutUint32(msg[offMsgType:], MsgResponse)
	le.PutUint32(msg[offErrCode:], code)
}
