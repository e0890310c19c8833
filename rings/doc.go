// Package rings implements the pvrdma descriptor rings as pure logic over
// DMA memory: the shared producer/consumer index pair, the producer side the
// driver uses for the send, receive and shared-receive queues, the consumer
// side it uses for completion queues, and the codecs for send WQEs, receive
// WQEs and CQEs.
//
// # The index scheme
//
// A ring of n elements (n a power of two) has two 32-bit counters in a
// ring-state page: prod_tail at byte 0 and cons_head at byte 4 (see [State]).
// Both run over 0 … 2n−1; the slot is counter & (n−1), and the bit worth n is
// a wrap (generation) bit, so that an empty ring (prod_tail == cons_head) and
// a full one (prod_tail == cons_head ^ n) are told apart. A counter with any
// bit outside 2n−1 is invalid (pvrdma_ring.h in Linux and rdma-core; QEMU's
// pvrdma_dev_ring.c masks with the same arithmetic).
//
// # Device-shared memory contract
//
// The ring state and the element pages live in DMA memory that the device
// reads and writes at any time, concurrently with the driver. The package
// therefore:
//
//   - accesses each counter only with single aligned 32-bit atomic loads
//     and stores (sync/atomic; the only unsafe code is the conversion of the
//     state bytes to *uint32, in state_unsafe.go);
//   - on the producer side has the caller write the element bodies first
//     and makes them visible with one store of prod_tail last ([Producer.Publish]);
//     the atomic store orders every earlier store before it (on amd64 it is
//     an XCHG, a full barrier; on arm64 a store-release);
//   - on the consumer side reads the device's counter once per call, validates
//     it, and only then lets the caller read element bodies ([Consumer.Ready]);
//   - treats every index the device writes as untrusted: a value with bits
//     outside 2n−1, or one that implies more than n elements in flight, is an
//     *[IndexError] wrapping [ErrDeviceFault]. Nothing is consumed or
//     produced on that path, and no device-written value can make the package
//     panic or touch memory outside the ring.
//
// Caller bugs (advancing past the free space, consuming more than is ready,
// a slot buffer too short for the SGEs) panic, as they would corrupt a ring
// the device is reading.
//
// # Lifecycle
//
// Zero the ring-state page and create the object (QEMU never initialises the
// counters, and zeroes the element pages at CREATE, so write elements only
// after the object exists). Build a [State] over the 8 bytes of the ring
// (QP send queue at page offset [StateOffsetSQ], everything else at
// [StateOffsetRQ]) and a [Producer] or [Consumer] over it. When a QP returns
// to RESET, [Producer.Reset] zeroes both counters, as Linux and rdma-core do.
// A State, Producer or Consumer holds no resources; dropping it is enough,
// but the memory under it must stay mapped for as long as it is used.
//
// # Concurrency
//
// A [Producer] and a [Consumer] are single-owner: one goroutine (or a caller
// holding a lock) uses each. The other party is the device, which runs
// concurrently; the only synchronisation with it is the counters. A [State]'s
// accessors are safe for concurrent use.
//
// # Codecs
//
// [PutSendWQE], [PutRecvWQE] and [DecodeCQE] translate between Go structs and
// the device's little-endian layouts (pvrdma_sq_wqe_hdr, pvrdma_rq_wqe_hdr,
// pvrdma_sge, pvrdma_cqe in the vmw_pvrdma ABI header). They allocate nothing.
// [DecodeSendWQE], [DecodeRecvWQE] and [PutCQE] are the device-side mirrors,
// for device models and tests.
package rings
