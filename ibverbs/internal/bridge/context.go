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
	fabric   *pvsim.Fabric // VFRDMA_FABRIC's, joined for the model; nil otherwise
}

var contexts table[Context]

// ContextByID returns the open context of id, or nil.
func ContextByID(id uint32) *Context { return contexts.get(id) }

// ParsePollPace reads EnvPollPace's value: "" is the driver's default (0),
// "every" every empty poll (-1); else a Go duration, where a negative one
// is every empty poll too.
func ParsePollPace(v string) (time.Duration, error) {
	switch v {
	case "":
		return 0, nil
	case "every":
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not a duration (say 50us, or every)", errInvalid, EnvPollPace, v)
	}
	if d == 0 {
		return 0, fmt.Errorf("%w: %s=0: give a pace (say 50us), or every, or leave it unset for the default", errInvalid, EnvPollPace)
	}
	return d, nil
}

// Open opens the device of info: a model in the process (Info.Model), or
// the PCI function through VFIO. A function another process holds is an
// error with Errno EBUSY.
func Open(info DeviceInfo, env Env) (*Context, error) {
	// An empty poll rings the POLL doorbell, as rdma-core's provider does:
	// on QEMU it harvests the backend's completions at once, where a
	// program spinning on ibv_poll_cq without it starves the emulated
	// device (t_typical 2.1 ms against 126 µs, ib_send_lat 64 B). A
	// program's ibv_req_notify_cq arms beside it: while a CQ is armed on
	// the device no POLL doorbell rings (QEMU 7.2 can deadlock on the
	// two), and once its arm is spent they ring again (UCX arms its CQs
	// as it goes idle and polls between: ucp_am_lat 8 B ran at 2.9 ms one
	// way when the first arm stopped the doorbell for good).
	opts := &vfrdma.Options{SysfsRoot: env.Sysfs, PollDoorbell: true, ArmBesidePollDoorbell: true}
	pace, err := ParsePollPace(env.PollPace)
	if err != nil {
		return nil, err
	}
	opts.PollPace = pace
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
		if env.Fabric != "" {
			fab, err := pvsim.JoinFabric(env.Fabric)
			if err != nil {
				return nil, fmt.Errorf("%s=%s: %w", EnvFabric, env.Fabric, err)
			}
			cfg.Fabric, c.fabric = fab, fab
		}
		m, err := pvsim.New(cfg)
		if err != nil {
			return nil, errors.Join(err, c.closeFabric())
		}
		opts.SysfsRoot = ""
		opts.StateDir = "-"
		d, err := vfrdma.OpenFunction(m, opts)
		if err != nil {
			return nil, errors.Join(err, m.Close(), c.closeFabric())
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
	return errors.Join(err, c.closeFabric())
}

// closeFabric leaves the fabric directory the context's model joined.
func (c *Context) closeFabric() error {
	if c.fabric == nil {
		return nil
	}
	return c.fabric.Close()
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
