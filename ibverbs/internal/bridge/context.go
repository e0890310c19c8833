package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// CommandTimeout bounds each device command a verb issues.
const CommandTimeout = 30 * time.Second

// cmdCtx returns the context of one device command.
func cmdCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), CommandTimeout)
}

// Context is an open device (struct ibv_context).
type Context struct {
	ID   uint32
	Info DeviceInfo
	Dev  *vfrdma.Device
	env  Env

	model *pvsim.Device

	// async events: queued here, counted in the eventfd asyncFD (a
	// semaphore: one read per event).
	asyncFD  int
	amu      sync.Mutex
	aq       []AsyncEvent
	fwdDone  chan struct{}
	objMu    sync.Mutex
	qpOf     map[*vfrdma.QP]*QP
	cqOf     map[*vfrdma.CQ]*CQ
	srqOf    map[*vfrdma.SRQ]*SRQ
	closing  atomic.Bool
	attrOnce sync.Once
	attr     DeviceAttr
}

var contexts table[Context]

// ContextByID returns the open context of id, or nil.
func ContextByID(id uint32) *Context { return contexts.get(id) }

// Open opens the device of info: a model in the process (Info.Model), or
// the PCI function through VFIO. A function another process holds is an
// error with Errno EBUSY.
func Open(info DeviceInfo, env Env) (*Context, error) {
	opts := &vfrdma.Options{SysfsRoot: env.Sysfs}
	if env.Debug {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c := &Context{Info: info, env: env, asyncFD: -1,
		qpOf: map[*vfrdma.QP]*QP{}, cqOf: map[*vfrdma.CQ]*CQ{}, srqOf: map[*vfrdma.SRQ]*SRQ{}}
	if info.Model != "" {
		cfg, err := ParseModel(info.Model)
		if err != nil {
			return nil, err
		}
		m, err := pvsim.New(cfg)
		if err != nil {
			return nil, err
		}
		opts.SysfsRoot = ""
		opts.StateDir = "-"
		d, err := vfrdma.OpenFunction(m, opts)
		if err != nil {
			return nil, errors.Join(err, m.Close())
		}
		c.Dev, c.model = d, m
	} else {
		d, err := vfrdma.Open(info.BDF, opts)
		if err != nil {
			return nil, err
		}
		c.Dev = d
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_SEMAPHORE)
	if err != nil {
		_ = c.closeDevice()
		return nil, fmt.Errorf("ibverbs: async event fd: %w", err)
	}
	c.asyncFD = fd
	c.fwdDone = make(chan struct{})
	go c.forwardAsync()
	c.ID = contexts.put(c)
	return c, nil
}

func (c *Context) closeDevice() error {
	err := c.Dev.Close()
	if c.model != nil {
		err = errors.Join(err, c.model.Close())
	}
	return err
}

// Close closes the device: what the program did not destroy goes with it.
func (c *Context) Close() error {
	if !c.closing.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: context closed twice", errInvalid)
	}
	contexts.del(c.ID)
	forgetContext(c)
	err := c.closeDevice()
	<-c.fwdDone
	if c.asyncFD >= 0 {
		_ = unix.Close(c.asyncFD)
	}
	return err
}

// Logf prints a diagnostic when VFRDMA_DEBUG is set.
func (c *Context) Logf(format string, args ...any) { c.env.Logf(os.Stderr, format, args...) }

// AsyncFD is the context's async_fd: readable while events wait.
func (c *Context) AsyncFD() int { return c.asyncFD }
