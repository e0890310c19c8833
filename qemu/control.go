package qemu

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// defaultGetTimeout bounds a get that names no timeout of its own.
const defaultGetTimeout = 60 * time.Second

// rendezvous is the key/value store the VMs of one run share. A key is
// written once; a get waits until it is.
type rendezvous struct {
	mu     sync.Mutex
	vals   map[string]string
	wait   map[string]chan struct{} // closed when the key is put
	closed chan struct{}
	once   sync.Once
}

func newRendezvous() *rendezvous {
	return &rendezvous{vals: map[string]string{}, wait: map[string]chan struct{}{}, closed: make(chan struct{})}
}

func (kv *rendezvous) ready(key string) chan struct{} {
	ch, ok := kv.wait[key]
	if !ok {
		ch = make(chan struct{})
		kv.wait[key] = ch
	}
	return ch
}

func (kv *rendezvous) put(key, val string) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	if old, ok := kv.vals[key]; ok {
		if old == val {
			return nil
		}
		return fmt.Errorf("key %q already holds %q", key, old)
	}
	kv.vals[key] = val
	close(kv.ready(key))
	return nil
}

func (kv *rendezvous) get(key string, timeout time.Duration) (string, error) {
	kv.mu.Lock()
	ch := kv.ready(key)
	kv.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		kv.mu.Lock()
		defer kv.mu.Unlock()
		return kv.vals[key], nil
	case <-t.C:
		return "", fmt.Errorf("key %q: nobody put it within %v", key, timeout)
	case <-kv.closed:
		return "", errors.New("run is over")
	}
}

func (kv *rendezvous) close() { kv.once.Do(func() { close(kv.closed) }) }

// control serves one VM's control channel: QEMU connects to the socket as a
// client and relays the guest's ttyS1.
type control struct {
	path string
	ln   *net.UnixListener
	kv   *rendezvous
	log  *slog.Logger
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn net.Conn
	done chan struct{}
	// onKill kills the VM (proto.OpKill); nil refuses the request.
	onKill func()
	// onSetLink sets the VM's Ethernet link (proto.OpSetLink); nil refuses.
	onSetLink func(up bool) error
}

func listenControl(path string, kv *rendezvous, log *slog.Logger, onKill func()) (*control, error) {
	os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("bench: control socket: %w", err)
	}
	c := &control{path: path, ln: ln, kv: kv, log: log, done: make(chan struct{}), onKill: onKill}
	c.wg.Add(1)
	go c.accept()
	return c, nil
}

func (c *control) accept() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.conn != nil {
			c.conn.Close()
		}
		c.conn = conn
		c.mu.Unlock()
		c.wg.Add(1)
		go c.serve(conn)
	}
}

// serve answers requests in order. A get blocks this VM's channel until the
// key arrives, which is what a guest waiting for its peer wants.
func (c *control) serve(conn net.Conn) {
	defer c.wg.Done()
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 4096), 1<<20)
	enc := json.NewEncoder(conn)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var req proto.Request
		var rep proto.Reply
		if err := json.Unmarshal(line, &req); err != nil {
			rep.Error = fmt.Sprintf("bad request %q: %v", line, err)
		} else {
			switch req.Op {
			case proto.OpPut:
				if err := c.kv.put(req.Key, req.Value); err != nil {
					rep.Error = err.Error()
				}
			case proto.OpGet:
				d := defaultGetTimeout
				if req.TimeoutMS > 0 {
					d = time.Duration(req.TimeoutMS) * time.Millisecond
				}
				v, err := c.kv.get(req.Key, d)
				rep.Value = v
				if err != nil {
					rep.Error = err.Error()
				}
			case proto.OpKill:
				if c.onKill != nil {
					c.log.Debug("control: killing the VM on its request")
					c.onKill()
					return // no reply: the VM is gone
				}
				rep.Error = "this channel cannot kill its VM"
			case proto.OpSetLink:
				switch {
				case c.onSetLink == nil:
					rep.Error = "this channel cannot set its VM's link"
				case req.Value != "up" && req.Value != "down":
					rep.Error = fmt.Sprintf("set_link %q: want up or down", req.Value)
				default:
					if err := c.onSetLink(req.Value == "up"); err != nil {
						rep.Error = err.Error()
					}
				}
			default:
				rep.Error = fmt.Sprintf("unknown op %q", req.Op)
			}
		}
		c.log.Debug("control", "req", req, "reply", rep)
		if err := enc.Encode(rep); err != nil {
			return
		}
	}
}

func (c *control) close() {
	c.ln.Close()
	c.mu.Lock()
	if c.conn != nil {
		c.conn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
	os.Remove(c.path)
}
