// Package qemu is the test bench as a library: it boots QEMU 7.2 guests with
// the emulated pvrdma device (TCG, q35, intel-iommu, shared-memory RAM,
// vmxnet3 at function 0, pvrdma at function 1) on the project's software RDMA
// backend, and collects what the guest init reports.
//
// Per VM a run owns: a MAD-mux responder (package mux) that QEMU connects to
// and that registers the guest's GIDs in the backend's fabric; a control
// channel (the guest's ttyS1) served by a key/value rendezvous shared by all
// VMs of the run, so tests in different VMs can exchange QP addresses; and the
// QEMU process, whose console is parsed for proto records and otherwise kept
// only as a capped tail. Every run has a hard timeout, a cap on console and
// error output (a bad WQE can make QEMU log hundreds of MB), and kills QEMU as
// soon as the guest reports that it is done.
//
// The sub-packages: proto (the wire format), fabric (GID registration), mux,
// guest (kernel and initramfs), guestinit (the guest's /init), guestctl (the
// guest side of the control channel), softverbs (the backend, in C).
//
// Nothing here prints: callers get records through Options.OnRecord and
// results and errors as values.
package qemu
