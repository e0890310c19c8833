// Package vmxnet3 drives the Ethernet function (function 0) of the pvrdma
// slot: bring-up through the same VFIO group as the RDMA function, link
// state and link-change events, and batched transmit and receive of whole
// frames, one buffer per frame. docs/vmxnet3.md describes the device as
// this package uses it.
//
// # Lifecycle
//
// Open returns an active NIC; Close quiesces and resets the function and
// frees its DMA memory, BAR mappings and interrupt vectors. After Close
// every method that can fail returns an error wrapping ErrClosed; a call
// racing Close either completes or returns ErrClosed; Close waits for the
// calls in progress before it frees anything they use, and wakes the
// sleepers of RecvWait and WaitLinkChange. A second Close returns nil.
// ErrClosed here is vmxnet3's own sentinel: this package sits beside the
// RDMA stack, not above it.
//
// # Concurrency
//
// One goroutine may send while another receives; the control calls (Link,
// WaitLinkChange, Stats, Close) are safe for concurrent use with each
// other and with the data path. Send and Recv do not allocate.
//
// # Device-shared memory
//
// The rings and buffers are DMA memory the device reads and writes at any
// time while the NIC is active. Every value the device writes is checked
// before it is used: a transmit completion must name the oldest descriptor
// in flight; a receive completion must name ring 0 and the descriptor due
// next, be one whole frame, and be no longer than its buffer. A value
// that fails is an error wrapping ErrDeviceFault, never a panic.
package vmxnet3
