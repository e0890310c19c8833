// Package doorbell rings pvrdma UAR doorbells and implements deferred posts
// for one work queue: the NDK semantics of NDK_OP_FLAG_DEFER (Windows
// NDKPI), where a chain of posts flagged Defer is written to the ring without
// a doorbell and the next post without the flag rings one doorbell for the
// whole chain.
//
// # Rules
//
// For one work queue (a QP's send queue, its receive queue, or an SRQ) a
// [Queue] applies these rules, which the posting code drives by telling it
// what happened:
//
//   - Added(n): n WQEs were written to the ring; they are pending (written,
//     not yet handed to the device).
//   - Post(true): a deferred post ended. Nothing is published, no doorbell.
//   - Post(false): a post without Defer ended. If anything is pending, the
//     producer index is published and ONE doorbell is written for all of it;
//     with nothing pending, nothing happens (no empty doorbell: each one is a
//     VM exit).
//   - Fail(): a post failed inline (validation, queue full). Everything
//     pending (earlier deferred posts, and WQEs this call wrote before it
//     failed) is still handed to the device: publish, then one doorbell. The
//     failed WQE itself was never written, so it produces nothing, and no
//     completion.
//   - Ring(): publish and ring if anything is pending (for example before
//     waiting on a CQ, or when the caller decides a deferred chain has ended).
//
// QEMU 7.2 handles a QP or SRQ doorbell synchronously and drains every WQE up
// to prod_tail (re-reading it as it goes), so one doorbell after one publish
// hands the device everything pending (facts sheet §7).
//
// # Ordering: body, then index, then doorbell
//
// A WQE must reach the device in three steps, each visible before the next:
// the caller writes the WQE body (plain stores to DMA memory); Publisher.Publish
// stores prod_tail (rings.Producer: one sync/atomic store); the Queue then
// writes the doorbell (mmio.Region.Store32: one plain store to the
// uncached BAR mapping, issued from an assembly helper).
//
// On amd64 this order holds without further fences. The atomic store of
// prod_tail is an XCHG, a locked instruction and so a full barrier: every
// earlier store (the bodies) is globally visible before it, and it is
// visible before any later store. The Go compiler does not move memory
// accesses across a sync/atomic operation, nor across the call to the
// doorbell helper. x86 keeps stores in program order (TSO), and a store to
// uncached (UC) memory, as VFIO maps BARs, is not reordered with older
// stores to write-back memory. Under a hypervisor the doorbell store traps
// (a VM exit) only after the earlier stores have retired, and QEMU reads the
// ring from guest memory from inside that exit.
//
// A weaker architecture needs an explicit barrier between the publish and
// the doorbell: a store-release (how sync/atomic stores prod_tail on arm64)
// orders earlier accesses before itself, not a later store after it, and a
// store to device memory may otherwise overtake stores to ordinary memory on
// the way to the device. arm64 needs DMB OSHST (what Linux's wmb() and
// writel() supply), riscv64 FENCE W,O, ppc64 SYNC. mmio's non-amd64 fallback
// stores the doorbell with sync/atomic (STLR on arm64), which orders the
// prior stores before it for an emulated device that traps on the store,
// but a port to real hardware should put the barrier in mmio's store helper,
// where every doorbell passes.
//
// # Lifecycle and concurrency
//
// Create a Queue when the work queue is created, over the UAR page (a
// *mmio.Region satisfies [Register]) and the ring's producer (a
// *rings.Producer satisfies [Publisher]). It holds no resources. When the QP
// returns to RESET, Reset drops the pending count along with the ring.
//
// A Queue is single-owner: the goroutine (or lock holder) that posts to the
// work queue uses it, together with the ring producer it publishes; it is
// not safe for concurrent use. Ring is a plain function; whether concurrent
// doorbell writes make sense is the device's business (QEMU serialises them).
package doorbell
