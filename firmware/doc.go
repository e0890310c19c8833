// Package firmware is the control plane of the VMware paravirtual RDMA device
// (PCI 15ad:0820): the Device Shared Region (DSR) and the capabilities the
// device writes into it, the command channel (a command slot, a response
// slot and the REQUEST/ERR registers), a typed codec for every command, the
// page directories through which the device finds multi-page objects, the two
// device rings of the DSR (async events and CQ notifications), and the
// differences between QEMU 7.2's emulation and the device it models.
//
// Everything here is pure Go over byte slices and a small register interface
// ([Regs]); the caller owns the BAR mapping and the DMA memory and hands both
// in. Wire layouts are written with encoding/binary (little-endian), so the
// package needs no unsafe code.
//
// # Lifecycle
//
// The bring-up order follows the device (and Linux's probe):
//
//  1. Allocate DMA memory: the DSR (one page), one page each for the command
//     and response slots, and for each device ring a state page, data pages
//     and a page directory ([WriteRingPageDir]).
//  2. [NewChannel] over the BAR1 registers and the two slots.
//  3. [Channel.Start] (or its steps: [Channel.ReadVersion], [DSR.Encode],
//     [Channel.LoadDSR], [Channel.SetInterruptMask], [Channel.Activate]):
//     the device reads the DSR, fills in the capabilities, and is activated.
//     The result carries the validated [Caps] and the [Quirks] to consult.
//     With [StartConfig].NoActivate, Start stops once the DSR is loaded and
//     the caller activates when it is ready (commands are accepted before).
//  4. Commands: [Channel.Exec] with any [Request]/[Response] pair, or the
//     typed helpers ([Channel.CreatePD], [Channel.CreateQP], ...). No command
//     is sent before the DSR is loaded: on QEMU 7.2.0 and 7.2.1 a command
//     before that crashes the emulator (CVE-2022-1050).
//  5. Teardown: destroy every object (the device never frees them itself,
//     not even on reset), mask interrupts, [Channel.Reset], [Channel.Close],
//     then free the DMA memory.
//
// # Concurrency
//
// A [Channel] is safe for concurrent use: commands are serialised, one at a
// time, as the device has a single command slot. Waiting for the channel is
// bounded by the caller's context. The device rings ([AsyncRing],
// [CQNotifyRing]) are single-owner: one goroutine polls each ring. The codecs
// and page-directory builders are plain functions over caller memory.
//
// # Safety
//
// Everything the device writes (the ERR register, the response slot, the
// capabilities, the ring producer indices) is validated before use. A value
// out of range is an error wrapping [ErrDeviceFault], never a panic and never
// an out-of-bounds access. Requests are validated against the limits that
// would otherwise make QEMU 7.2 corrupt memory or crash (zero or unaligned
// page addresses, ring page counts, undersized rings), and rejected with an
// error wrapping [ErrInvalid].
//
// The package never prints, logs or exits. Errors from a device operation
// are [*OpError] values naming the operation and the device and wrapping a
// sentinel, a [syscall.Errno] decoded from the device status, or both.
//
// The layouts come from the device's interface header (pvrdma_dev_api.h and
// pvrdma_verbs.h in Linux) and the behaviour of QEMU 7.2's hw/rdma/vmw; see
// the project's facts sheet (pvrdma-device.md) for the section each part
// implements.
package firmware
