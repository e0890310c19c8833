// Command ibverbs is the libibverbs drop-in over the Go driver: built
// with `make dropin` (go build -buildmode=c-shared, linked with
// verbsabi/libibverbs.map and soname libibverbs.so.1) into
// build/vfrdma/libibverbs.so.1, it replaces rdma-core's libibverbs for
// unmodified verbs programs (perftest, rdma-core's examples, UCX's uct_ib)
// loaded with LD_LIBRARY_PATH:
//
//	make dropin
//	LD_LIBRARY_PATH=$PWD/build/vfrdma VFRDMA_MODEL=v20 ibv_devinfo -v
//
// A thin C layer (verbs.c, dropin.h) owns the ABI's structures: the device
// list, struct ibv_context inside a struct verbs_context (query_port and
// query_device_ex among its extended ops), and the PD, MR, CQ, completion
// channel, QP, SRQ and AH structures, each holding the id of its Go object.
// Every verb calls into Go once (glue.go); the semantics are package
// internal/bridge's. The device-independent calls and the provider-private
// interface come from verbsabi/ (abi_common.c, abi_private.c).
//
// # Environment
//
//   - VFRDMA_MODEL=v17|v18|v19|v20|qemu (",rocev2" optional): the device
//     list is one device, vfrdma0, a pvsim model in the process: no root,
//     no VFIO.
//   - VFRDMA_DEVICE=<BDF>: of the pvrdma functions bound to vfio-pci, list
//     only that one. Without it every one is listed, vfrdma0, vfrdma1, ...
//     in PCI address order; none is an empty list, not an error. A function
//     is one context at a time: a second ibv_open_device of it, in this
//     process or another, is NULL with errno EBUSY. (On the model each
//     ibv_open_device makes a model of its own: two contexts reach each
//     other only on a fabric, VFRDMA_FABRIC.)
//   - VFRDMA_DEBUG=1: diagnostics (each refused verb's reason, the driver's
//     debug log) on stderr. Without it the library never prints.
//   - VFRDMA_FABRIC=DIR, with VFRDMA_MODEL: the model joins the fabric of
//     directory DIR (pvsim.JoinFabric), which the models of other
//     processes naming it share: two programs on one host talk RDMA.
//   - VFRDMA_POLL_PACE=D: on QEMU's device, ring the POLL doorbell on an
//     empty ibv_poll_cq at most once per D (a Go duration, vfrdma's
//     Options.PollPace); "every" rings it on every empty poll, as
//     rdma-core's provider does. Unset: the driver's default. Another
//     value fails ibv_open_device with EINVAL. ibv_req_notify_cq arms
//     beside the doorbell: while one of the context's CQs is armed on
//     the device (no completion since its arm) empty polls ring no POLL
//     doorbell, which QEMU 7.2 could deadlock on; after, they ring again.
//   - VFRDMA_CALLS=1: count the data path's calls per context (post_send
//     and post_recv with their work requests, poll_cq with the empty ones
//     and the completions, req_notify_cq: each one a crossing into Go) and tell them on
//     stderr at ibv_close_device. Without it nothing is counted.
//   - VFRDMA_SYSFS: the sysfs root the function scan reads (tests).
//
// # Errors
//
// As rdma-core's providers give them: calls returning a pointer return
// NULL with errno; calls returning int return the errno value (or -1 with
// errno where libibverbs does so: ibv_query_gid, ibv_get_cq_event,
// ibv_get_async_event). A post returns an errno with *bad_wr at the first
// refused request; those before it are posted. EINVAL: a bad argument, a
// bad lkey, too many SGEs, the wrong QP state; ENOMEM: a full queue; EBUSY:
// the device open in another process, or an object in use; EOPNOTSUPP:
// what the drop-in does not do (UC, XRC, memory windows, dmabuf, rereg,
// resize CQ, moves back to RESET, SQD; the extended QP and CQ interfaces,
// which programs then replace by the legacy calls). ibv_poll_cq returns
// the count or -1.
//
// # Limits
//
// The device has no inline data: a QP asking max_inline_data (up to 512
// bytes) gets a registered ring of one slot per send queue entry, and an
// IBV_SEND_INLINE request's bytes are copied there at post (the program
// may reuse its buffer at once, as the verbs promise). Address vectors
// need a GRH (RoCE).
// A CQ's solicited-only arming on a completion channel wakes for any
// completion (a spurious event, which the verbs allow). ibv_destroy_cq
// does not wait for unacknowledged events. MRs: the program's own memory,
// any alignment, at its own address (PD.RegisterMRAt), or at an iova at
// the same offset in its page (ibv_reg_mr_iova), as the kernel requires.
//
// UCX's uct_ib lists a device only if /dev/infiniband/<dev_name> is a
// character device (a kernel uverbs node); the drop-in's devices are named
// uverbs0, uverbs1, ... there, so a machine without the kernel's RDMA
// stack needs such a node for UCX (any character device will do: UCX only
// stats it). perftest's -R (RDMA CM) mode is not supported: the
// librdmacm.so.1 make dropin puts beside the library fails every call
// with ENOSYS.
//
// # Threads
//
// The Go runtime starts when the library is loaded, on threads of its own
// (GOMAXPROCS of them and a few more for system calls). Each context has
// the driver's goroutines (its notification and event demultiplexers) and
// one that forwards the device's async events to the context's eventfd;
// on the model, the model's goroutines too. A program thread that calls a
// verb runs the Go code itself (a cgo callback, which needs one of the
// runtime's GOMAXPROCS Ps: where the model's goroutines keep them busy,
// the crossing waits, which BenchmarkPostPoll shows as its spread);
// ibv_get_cq_event and ibv_get_async_event block that thread in
// epoll_wait(2) or read(2).
//
// # Signals
//
// Go's rules for c-shared libraries hold (os/signal, "Go programs that use
// cgo or SWIG" and "Non-Go programs that call Go code"): when the library
// loads, the runtime installs handlers for the synchronous signals
// (SIGSEGV, SIGBUS, SIGFPE), SIGPIPE and SIGURG (goroutine preemption),
// keeping the program's earlier handlers, which it calls for a synchronous
// signal raised outside Go code. It installs no other handler (the library
// calls no os/signal.Notify), so the program's handlers for SIGINT,
// SIGTERM, SIGALRM, SIGUSR1 and the rest are the ones that run, installed
// before or after the library loads (tests/dropin_test.c checks a signal
// sent to the process and one raised in a thread). As Go requires of
// every handler in a process that runs Go, a program's handler should be
// installed with SA_ONSTACK: a signal sent to the process may land on one
// of the library's threads, whose stacks are small. The library never
// calls os.Exit and never changes a signal mask.
package main
