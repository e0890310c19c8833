package vfrdma

import (
	"io"
	"log/slog"
	"time"

	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vmxnet3"
)

// DefaultStateDir keeps the journals of live device objects.
const DefaultStateDir = "/run/vfrdma"

// DefaultCommandTimeout bounds each device command.
const DefaultCommandTimeout = 10 * time.Second

// DefaultPollPace is the POLL doorbell's pace on QEMU's device
// (Options.PollPace).
const DefaultPollPace = 50 * time.Microsecond

// DefaultSpin is how long CQ.Wait polls before it sleeps on VMware's
// device (Options.Spin).
const DefaultSpin = event.DefaultSpin

// Options configure Open. The zero value (or nil) means the defaults.
type Options struct {
	// SysfsRoot is the sysfs tree ("" means /sys).
	SysfsRoot string
	// BindGroup binds the function's IOMMU group to vfio-pci if it is not
	// bound yet, and gives it back to its drivers on Close. Without it the
	// group must already be bound (pvctl bind).
	BindGroup bool
	// VFIO chooses the kernel interface Open takes the function through
	// (package vfio's Options.Path): the zero value (vfio.PathAuto) takes
	// the device cdev with iommufd where the kernel offers them (Linux 6.6+
	// with CONFIG_VFIO_DEVICE_CDEV and CONFIG_IOMMUFD) and the IOMMU group
	// with a type1 container otherwise; vfio.PathCDev and vfio.PathGroup
	// insist. Device.VFIOPath says which was taken. Both need the group
	// bound to vfio-pci: on the cdev path each function Open uses (the
	// pvrdma function, and the vmxnet3 function unless Ethernet.Off) is
	// opened and bound alone, but the kernel still refuses it while
	// another member of the group is on a kernel driver.
	VFIO vfio.Path
	// StateDir holds the journal of live objects ("" means DefaultStateDir;
	// "-" disables the journal and with it the clean-up after a crash).
	StateDir string
	// CommandTimeout bounds each device command ("0" means the default).
	CommandTimeout time.Duration
	// ForceActivate activates the device even where the driver finds it
	// already active. On QEMU that restarts the backend's completion thread,
	// which blocks the vCPU for 2 s or more.
	ForceActivate bool
	// PollDoorbell makes an empty CQ poll ring the device's POLL doorbell
	// and look again, as the reference provider does: on QEMU the doorbell
	// harvests the backend's completions at once. Off by default: in a VM
	// every doorbell is an exit, and QEMU's completion thread delivers
	// completions without it once the device is active. On QEMU 7.2 it
	// excludes interrupts: a POLL doorbell deadlocks the VM against the
	// completion thread raising an armed CQ's interrupt, so with it CQs are
	// never armed (CQ.Arm returns ErrNotSupported, CQ.Wait polls, wait sets
	// cannot sleep on the device's CQs).
	PollDoorbell bool
	// ArmBesidePollDoorbell, with PollDoorbell on QEMU's device, lets its
	// CQs be armed after all: an empty poll then rings the POLL doorbell
	// only while no CQ of the device is armed in the device's sense
	// (armed, and no CQE written to it since the arm, or one written
	// within the last 5 ms: the interrupt comes after it), when the deadlock
	// above cannot happen, and an arm first waits out the POLL doorbells
	// ringing. CQs are then Armable, and Wait sleeps on the interrupt. For
	// programs that poll with the doorbell and sometimes ask for an
	// interrupt: the libibverbs drop-in sets it (UCX arms its CQs as it
	// goes idle, and polls between).
	ArmBesidePollDoorbell bool
	// PollPace, with PollDoorbell, rings the POLL doorbell on an empty
	// poll at most once per PollPace per CQ: a spinning poller then pays
	// one exit per PollPace instead of one per look. Zero means the
	// default: DefaultPollPace on QEMU's device (measured in
	// docs/benchmarks.md: fewer exits, the same latency, a higher rate),
	// every empty poll on VMware's, as the reference provider rings it. A
	// negative PollPace rings on every empty poll.
	PollPace time.Duration
	// Spin is how long CQ.Wait polls the ring before it arms the CQ and
	// sleeps on the interrupt: a completion that comes within it costs no
	// interrupt, no arm doorbell and no wake-up (Linux's busy polling does
	// the same for sockets). A Wait that ends up sleeping has burned at
	// most Spin of CPU. Zero means the default: DefaultSpin on VMware's
	// device, no spin on QEMU's, whose device work runs on the host cores
	// a spinning guest takes (measured in docs/benchmarks.md: spinning
	// lengthens the round trip there). A negative Spin never spins. Wait
	// sets take their members' spin (CQ.Spin) unless set.
	Spin time.Duration
	// Logger receives the driver's debug messages (default: none).
	Logger *slog.Logger
	// Ethernet says what Open does with the slot's vmxnet3 function. By
	// default (the zero value) it brings it up beside the RDMA function
	// (Device.Ethernet): QEMU reports the RDMA port's state only while the
	// vmxnet3 function is active, DOWN otherwise, and it shares the IOMMU
	// group anyway (on the group path it comes from the same group fd; on
	// the cdev path through its own cdev, bound to the same iommufd and
	// attached to the same IOAS).
	Ethernet EthernetOptions
}

// EthernetOptions say what Open does with the slot's vmxnet3 function
// (Options.Ethernet). The zero value brings it up with vmxnet3's defaults.
type EthernetOptions struct {
	// Off leaves the function alone (its VFIO device is not opened, and
	// Device.Ethernet is nil): the RDMA port then reads DOWN on QEMU.
	Off bool
	// NIC tunes the function Open brings up (zero fields: vmxnet3's
	// defaults).
	NIC vmxnet3.Options
}

// check refuses options no device can take.
func (o *Options) check() error {
	if o == nil {
		return nil
	}
	if o.CommandTimeout < 0 {
		return invalidf("Options.CommandTimeout %v is negative", o.CommandTimeout)
	}
	if _, err := vfio.ParsePath(string(o.VFIO)); err != nil {
		return invalidf("Options.VFIO %q: want vfio.PathAuto, vfio.PathCDev or vfio.PathGroup (auto, cdev or group)", string(o.VFIO))
	}
	return nil
}

func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	switch c.StateDir {
	case "":
		c.StateDir = DefaultStateDir
	case "-":
		c.StateDir = ""
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}
