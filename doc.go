// Package vfrdma is a kernel-bypass driver for the VMware paravirtual RDMA
// adapter (PCI 15ad:0820): it takes the device from the kernel through VFIO
// and gives Go services RDMA verbs.
//
// Open takes a pvrdma function whose IOMMU group is bound to vfio-pci (pvctl
// bind, or Options.BindGroup), maps its registers and doorbell page, pins the
// control structures in DMA memory at IOVAs, loads the Device Shared Region,
// validates the capabilities, enables MSI-X and activates the device. The
// Device then creates protection domains, completion queues and the other
// objects through the device's command channel.
//
// # Lifecycle
//
// Close destroys every object the Device created, in dependency order (the
// device does not: QEMU keeps objects alive across a reset), quiesces the
// device, and releases the interrupts, DMA memory, mappings and VFIO handles.
// Closing the Device closes every object. A process that is killed cannot
// clean up: the Device journals the handles of its live objects in a state
// directory, and the next Open of the same function destroys what the
// journal lists before anything else.
//
// One rule holds for the Device and every object (PD, MR, AH, CQ, QP, SRQ,
// and a CQ's part in poll sets, wait sets and counters), as for os.File
// and net.Conn:
//
//   - After Close, every method that returns an error returns one wrapping
//     ErrClosed (posts: a *PostError wrapping it). Accessors of fixed
//     attributes (Handle, QPN, LKey, ...) still answer; MR.Bytes returns
//     nil.
//   - Close is idempotent: a second Close returns nil, and so does an
//     object's Close once Device.Close has begun (it waits for it).
//   - A call racing Close either completes or returns ErrClosed; a waiter
//     asleep (CQ.Wait, a wait set or poll set on the CQ) is woken and
//     returns ErrClosed.
//   - No memory is unmapped or freed while a call may still touch it:
//     each object keeps an in-use count that the calls touching its rings
//     or the device's pages enter (two atomic adds per post or poll call);
//     Close shuts it, waits for the calls inside, and only then releases.
//   - If the device refuses an object's DESTROY, the object stays as it
//     was, open and usable, and Close returns the error (a later Close
//     retries); Device.Close shuts such objects all the same before it
//     unmaps anything, and last runs the functions Device.AfterClose
//     registered: memory of the caller's own that an MR the device kept
//     registered (RegisterMR, RegisterMRAt) may be freed there.
//   - Device.Close waits for the control calls under way (an object created
//     meanwhile is destroyed with the rest), so it leaks nothing.
//
// # Outstanding work requests
//
// A work request is outstanding from its post until a Poll hands it back
// to the caller: the Poll that returns its completion (success, error or
// WR_FLUSH_ERR), or, for an unsignaled send on a device that honours
// signaling, the first Poll of its send CQ that finds the device has
// consumed it. A request the device has consumed and whose completion is
// not polled yet is still outstanding: its queue slot is not free again
// until the Poll. QP.Outstanding and SRQ.Outstanding count these, and a
// queue's room for posts is its depth less them.
//
// A QP handle the device gives again after a QP is destroyed never
// receives the destroyed QP's completions: those still in its CQs are
// moved to a key of the driver's own when the QP is destroyed.
//
// # QEMU 7.2 and VMware's device
//
// The data path follows what the device reports at Open (Device.Version,
// Device.Quirks, Device.Caps):
//
//   - QP handles: from interface version 20 the device names a QP by a
//     handle distinct from its number in doorbells, commands and CQEs;
//     completions are matched by handle (its low 16 bits, as Linux and
//     rdma-core read them), and WC.QPN and QP.QPN are the number peers
//     address. Below 20 (QEMU: 17) the two are one value.
//   - Signaling: QEMU completes every send. A VMware device honours
//     SendSignaled and QPConfig.SignalAll: an unsignaled send makes no
//     completion unless it fails; it is retired (QP.Outstanding no longer
//     counts it, and its slot comes back) by the first Poll of the send CQ
//     after the device has consumed it or after a later send's completion,
//     whichever comes first. Closing the QP flushes every send still
//     outstanding exactly once, except the unsignaled sends the device
//     consumed: those are retired without a completion. A consumed
//     unsignaled send that fails later still reports its failure.
//   - One-sided operations: RDMA WRITE (with immediate), RDMA READ,
//     compare-and-swap and fetch-and-add on RC QPs, with SendWR.RemoteAddr,
//     RKey and the atomic operands, into MRs registered with remote rights
//     (MR.RKey). They are checked before they reach the ring, against the
//     device's atomic_ops, max_qp_init_rd_atom and max_sge_rd too. QEMU
//     runs every send WQE as a plain SEND, so there every opcode but
//     OpSend is refused with ErrNotSupported and nothing is posted.
//   - Completions report the operation the device ran (WC.Opcode) and
//     immediate data (WC.Imm with WCFlagWithImm); QEMU reports WCSend and
//     WCRecv only.
//
// # Concurrency
//
// A Device is safe for concurrent use: commands are serialised by the
// command channel. Objects document their own rules.
//
// # Shared receive queues
//
// An SRQ (PD.CreateSRQ, QPConfig.SRQ) follows uDAPL's rules: receives
// posted once are consumed by any of its QPs, segments filled in order;
// posting is safe from many goroutines and refused inline with a distinct
// error; the SRQ counts what each QP consumed (SRQ.Query), raises a low
// watermark once per arming, resizes within a ring reserved at creation,
// and completes every receive exactly once, flushing what is left when it
// is closed. The semantics live in package srq, the ring and checks it
// shares with QPs in package wq.
//
// # API changes
//
// Names that changed, each old one's new form (the README's "API changes"
// has the details): QP.Flush and SRQ.Flush are QP.Ring and SRQ.Ring
// (doorbell.Stats.Flushes is Rings), and flush means only WR_FLUSH_ERR;
// Outstanding has the one meaning above on QPs and SRQs;
// Options.OnAsyncEvent is gone (Device.AsyncEvents); Options.NoEthernet
// is Options.Ethernet.Off, and Options.Ethernet's vmxnet3.Options are
// Options.Ethernet.NIC; Device.PortState returns a PortState; Unknown is
// UnknownCount; CQ.Ready, Watch, Unwatch, Syncer and Progress are
// CQSource's (CQ.Source), and a CQ a counter drives is put in CQCounted
// mode by CQ.SetMode, no longer by its first Progress.
//
// # Errors
//
// Errors are *OpError values that name the operation and the device and wrap
// the cause; errors.Is matches the sentinels of this package (which are the
// lower layers' sentinels, so ErrDeviceFault matches a firmware fault too)
// and errnos. The package never prints, logs unasked (Options.Logger), or
// exits.
package vfrdma
