// Package pvsim is a model of the VMware paravirtual RDMA device (PCI
// 15ad:0820) that a driver runs on in place of the real one: New returns a
// Device that is an hw.Function (registers, doorbell page, MSI-X vectors,
// DMA memory behind an IOMMU of its own), so vfrdma.OpenFunction takes it
// as it takes a VFIO function. It plays VMware's device at interface
// versions 17 to 20, RoCE v1 or v2, or QEMU 7.2's emulation of it
// (Config.QEMU), and moves data between QPs of one model and, through a
// Fabric, between models: two drivers in one test process talk RDMA. A
// Fabric from JoinFabric spans processes: the models of every process that
// names its directory meet there (a Unix socket per process, the GIDs
// bound named in the directory), so a service of several processes runs
// its tests on the model with no root and no kernel module. That fabric
// loses nothing either: a request counts as inside the model until the
// peer process's device has handled it (a notice comes back), so a slow
// peer is no loss, a request it dropped is one, and a peer process that
// died is a cut link (RETRY_EXC_ERR).
//
// # What it models
//
//   - Memory: AllocDMA gives anonymous mappings off the Go heap at device
//     addresses from the model's own allocator (above 4 GiB, never
//     reused, a guard page between buffers); MapDMA maps caller memory.
//     The device reaches memory only by device address through its
//     translation table; an address not mapped is a DMA fault it counts
//     and reports (an error completion, a refused command), never a
//     crash. A buffer is unmapped only while the device goroutine is not
//     touching memory.
//   - Register file (BAR1), the UAR page's bus address (hw.UARLocator,
//     Config.UARAddress), DSR, command channel, every command code 0 to
//     20 with the layouts of the facts sheet (pvrdma-device.md §2-§4,
//     pvrdma_dev_api.h), response cookies, acks and error bytes.
//   - Rings: QP send and receive queues, SRQs, CQs, the CQ-notification
//     and async-event rings, with the pvrdma index arithmetic (§5); every
//     counter, page directory and WQE the driver writes is validated
//     before use.
//   - Doorbells (§7), the three MSI-X vectors, IMR, ICR.
//   - A transport: RC (PSNs, ACK/NAK, RNR back-off, local ACK timeout and
//     retries, duplicates) and UD (qkey, GRH) SEND, SEND with immediate,
//     RDMA WRITE (with immediate), RDMA READ, compare-and-swap and
//     fetch-and-add, with rkey, access-right and bounds checks and the
//     verbs' completion statuses for each violation, flushes on ERR,
//     fences, signaled and unsignaled sends.
//   - Async events on the async ring and vector 1 where a device raises
//     them, and on demand (Raise, SetPort, Fatal, OverflowCQ, ErrorQP);
//     command faults on demand (InjectFault: never answered, answered with
//     an error, refused; ClearFaults) and answers lost on demand
//     (Fabric.LoseAnswers): the fault-injection API a driver's tests and
//     soaks use.
//   - Observability: Stats, QP/QPByNumber/QPs, SRQ, MRs, Objects, GIDs,
//     DMA, Events, State, Hazards; Fabric.Stats sums the Stats of a
//     fabric's devices. Among the counts: Retransmits (RC requests sent
//     again, after an ACK timeout or an RNR NAK), Timeouts (ACK timeouts
//     that declared a loss) and TimeoutsHeld (ACK timeouts that came due
//     with nothing lost, see below).
//
// # Sources, behaviour by behaviour
//
// The tags are those of shared/pvrdma-device.md (the QEMU 7.2 facts sheet:
// Q-* are QEMU v7.2.0 sources, K-* Linux vmw_pvrdma, R rdma-core) and
// shared/realdevice.md (L-* recent Linux, P-qph VMware's 2019 patch,
// R-68c rdma-core's commit 68c623814). "Model choice" marks what no source
// settles; "unverified" what realdevice.md marks so.
//
// Both modes:
//   - Layouts of the DSR, capabilities, commands, WQEs, CQEs, ring states,
//     doorbells, events: K-api/Q-api, facts sheet §3-§7, §10. The model
//     decodes and encodes them itself from those layouts, not with the
//     driver's codecs, so a codec mistake shows as a disagreement.
//   - DSRLOW then DSRHIGH loads the DSR and writes the capabilities; a DSR
//     the device cannot map is not loaded and no capabilities are written
//     (Q-main load_dsr, facts §11.5).
//   - Handles are allocated lowest-free (QEMU's bitmaps, Q-rm).
//   - RC requests wait for a receive while rnr_retry is 7 (the verbs; Q-be
//     forces 7 on QEMU); the RNR timer table and the local ACK timeout
//     (4.096 µs × 2^timeout) are the InfiniBand specification's.
//   - A responder's violation that consumes no receive WQE (RDMA WRITE,
//     READ, atomics: bad rkey, rights, bounds, alignment) answers with a
//     NAK, fails the responder's QP and raises QP_ACCESS_ERR or
//     QP_REQ_ERR on it; one that consumes a receive completes it in error
//     (LOC_LEN_ERR, LOC_PROT_ERR): the verbs' class C errors, as rxe
//     implements them [model choice for pvrdma, whose device is closed].
//   - A UD receive too small completes with LOC_LEN_ERR and fails the QP
//     [unverified: backend-specific on QEMU, facts §11.18].
//
// QEMU 7.2 mode (Config.QEMU):
//   - VERSION 17, ERR 0xFFFF until ACTIVATE, every store kept, VERSION
//     writable (Q-main, facts §2).
//   - Commands run inside the REQUEST write; ERR holds the handler's status
//     (0, -errno, or 0xFFFF with no response for RESIZE_CQ and codes past
//     20); vector 0 after every REQUEST (Q-main, facts §4). A REQUEST
//     before the DSR is loaded answers 0xFFFF as 7.2.2+ does (7.2.0 crashes:
//     a Hazard).
//   - Capabilities: only the fields QEMU writes, gid_types OR'ed with RoCE
//     v1, the others left as the driver wrote them (Q-main init_dev_caps,
//     facts §3); vendor_id and friends zero, which is how the driver's
//     firmware.QuirksFor recognises QEMU.
//   - MODIFY_SRQ and QUERY_SRQ swapped (code 18 runs the query and acks
//     0x80000013; code 19 runs the modify, which wants the LIMIT bit)
//     (Q-cmd handler table, facts §9).
//   - MODIFY_QP: only STATE and QKEY matter, values taken from the block
//     whatever the mask, INIT/RTR/RTS forwarded with QEMU's fixed RC values
//     (MTU 1024, rnr_retry 7, timeout 14, ...), other states only recorded,
//     RESET then INIT fails EIO; QUERY_QP reports the backend's state and
//     only offsets 16-51 (Q-cmd, Q-be, facts §8).
//   - Every send WQE runs as a signaled SEND of its SGEs: opcode, flags and
//     immediate data ignored, CQE opcode SEND (Q-be rdma_backend_post_send,
//     realdevice.md §3.3); receives complete as RECV without immediate data.
//     Below RTS a post fails with GENERAL_ERR/0x201; a bad num_sge or an
//     unbound GID index completes with 0x205/0x210 and QEMU then spins on
//     the WQE for ever: the model stops the QP instead and records a
//     Hazard (Q-qpops, facts §11.6).
//   - The data pages of a CQ, QP or SRQ ring are zeroed at CREATE (facts
//     §5, §11.24).
//   - Receives and SRQ receives are handed to the backend at doorbell time;
//     an SRQ receive completes on the CQ stamped at post (the receive CQ of
//     the QP that attached last) (Q-qpops, facts §9).
//   - Modify to ERR does not flush; errors of the backend QP (a bad lkey)
//     fail it and flush (facts §8, §11.17): an RC QP to ERR, a UD QP to
//     SQE (its send queue flushes, its receives go on; QUERY_QP reports
//     SQE), as the backend's verbs do. A VMware device is modelled the
//     same way for UD [the verbs' rule].
//   - A UD datagram with no receive is dropped; the backend AH uses hop
//     limit 1 (facts §6, §11.18).
//   - CQ arming: ARM with ARM_SOL arms once, ARM alone disarms, ARM_SOL
//     alone does nothing; a CQ-notification entry for every CQE, the
//     interrupt only if armed; a full CQ drops the CQE silently (Q-main,
//     Q-qpops pvrdma_post_cqe, facts §7).
//   - IMR: any non-zero value drops every interrupt (Q-main post_interrupt).
//   - No async events, ever (Q-*, realdevice.md §2.3): Raise and Fatal
//     return ErrNotSupported.
//   - DESTROY_PD/MR/UC always succeed; destroy order is not enforced
//     (facts §11.11); RESET frees nothing (facts §2).
//   - What QEMU 7.2.0 would crash, hang or corrupt memory on is recorded
//     in Hazards and refused or contained by the model: REQUEST before the
//     DSR, rings that do not fit their pages, page entries of 0, handles
//     past the limits (its off-by-one bitmap), SRQ receives before a QP,
//     a receive doorbell on an SRQ QP, objects destroyed while in use.
//
// VMware mode (the default):
//   - Versions (L-api, realdevice.md §1): 17 RoCE v1 only; 18 RoCE v2
//     allowed (Config.RoCEv2: gid_types exactly 0x2) and max_sge_rd and
//     max_fast_reg_page_list_len written; 19 the 64-bit uar_pfn in the DSR
//     and CREATE_UC (State.UARPFN, UCPFN); 20 the CREATE_QP v2 response
//     with a QP handle apart from the QP number (L-qp).
//   - Version 20: QP handles are small, from 1 (Linux indexes its table by
//     handle % max_qp, rdma-core takes handle 0 for absent: realdevice.md
//     §1.3 [inference]); QP numbers are 0x10000 + a random 16-bit value
//     (the physical HCA's, P-qph; the range is a model choice); CQEs carry
//     the handle in qp (R-68c, L-cq), src_qp carries QP numbers, QP events
//     carry handles (L-main); MR keys are random and unrelated to handles
//     (P-qph). Before 20, handle and number are one value from 1, and keys
//     are derived from the handle (lkey = handle, rkey = handle |
//     0x80000000) [the derivation is unverified].
//   - Capabilities: vendor 0x15ad, part 0x0820, hw_ver 1, page_size_cap
//     4096, atomic_ops CAS|FAA, max_srq 1024, and plausible limits; the
//     real values are not public [unverified]; Config.Caps adjusts them.
//     bmme_flags is 0: the model runs no fast-register or invalidate WRs.
//   - ERR is the accept status: 0 for a known command, 0xFFFF for an
//     unknown one; the result is in the response's error byte; the
//     response is written and vector 0 raised when the command has run,
//     at once or Config.CommandDelay later (L-cmd, realdevice.md §7
//     [inference]). Commands are taken from the slot at the REQUEST write.
//   - Commands validate what QEMU does not: ring sizes, attribute masks and
//     QP transitions (the verbs' ib_modify_qp_is_ok table), destroy order
//     (EBUSY), GID types against gid_types (a RoCE v1 GID on a RoCE v2
//     device is refused unless Config.AcceptAnyGIDType) [the real device's
//     checks are unverified]. srq_limit is ignored at CREATE_SRQ (the
//     verbs: "irrelevant for ibv_create_srq").
//   - Opcodes and send flags are honoured (L-qp, R qp.c, realdevice.md §3):
//     unsignaled sends complete nothing unless sq_sig_all (realdevice.md
//     §4 [inference]); errors always complete. cons_head advances when a
//     WQE is fetched, or with Config.SQConsumeOnCompletion when it
//     completes [unverified which]. CQEs carry immediate data, WITH_IMM,
//     RECV_RDMA_WITH_IMM, port 1, and for RoCE v2 network_hdr_type (L-h).
//   - Completions on a send queue come in order: a WQE that fails at fetch
//     behind RC requests in flight completes after them.
//   - CQ arming as the verbs: ARM for the next completion, ARM_SOL for the
//     next solicited or error one; the notification entry and vector 2
//     only when the arm fires (Config.CQNotifyAll: an entry for every CQE)
//     [unverified, realdevice.md §2.3]. A full CQ, or one whose indices are
//     invalid, raises CQ_ERR and takes no more CQEs.
//   - IMR bit n masks vector n (cause bits 1 << vector, L-api); masked
//     interrupts are dropped; ICR collects the cause bits and clears on
//     read [unverified].
//   - Async events (L-main pvrdma_intr1_handler, realdevice.md §2): written
//     to the async ring, vector 1; dropped (counted) when the ring is full
//     [unverified]. Raised by the device: QP_ACCESS_ERR and QP_REQ_ERR on a
//     responder's violation, QP_FATAL on a ring the device cannot read
//     [model choice] or ErrorQP, QP_LAST_WQE_REACHED when a QP of an SRQ
//     goes to ERR (the verbs), CQ_ERR on overflow, SRQ_LIMIT_REACHED once
//     when the receives left fall below an armed limit, which then reads 0
//     until MODIFY_SRQ arms it again (the verbs [inference], L-srq),
//     PORT_ERR/PORT_ACTIVE on SetPort (info 1), DEVICE_FATAL on Fatal
//     (info 0), after which commands read ERR -EIO and nothing moves until
//     a CTL RESET [unverified]. CTL RESET forgets every object
//     [unverified: Linux resets only at remove].
//
// # Model choices the sources do not settle
//
// Doorbells are queued and handled on the device goroutine after the
// write returns (QEMU handles them inside the MMIO write), so an arm that
// finds CQEs the driver has not consumed fires at once; a driver sees at
// worst an interrupt with nothing new. A POLL doorbell has nothing to
// harvest (the model writes CQEs as they happen). The fabric is lossless
// and keeps each sender's order; a request nobody takes (no destination,
// a QP not ready, a port down), an answer Fabric.LoseAnswers takes and a
// packet left unread in a device that closes are dropped and the
// requester's timeout retries the request. The model never invents a
// loss: the local ACK timeout runs on the host's clock, and an ACK timeout
// that comes due while the request or its answer is still inside the
// model (queued in a device's inbox or being handled) declares nothing
// lost, waits one more timeout (Stats.TimeoutsHeld) and retransmits
// nothing, so a model slower than the timeout (thousands of QPs, the race
// detector, a loaded host) never turns into RETRY_EXC_ERR or spurious
// retransmissions; a device fires only the timers due when it looks at
// them, and reads its inbox again before any timer re-armed since. A
// real device's timer knows nothing of where its packets are; on a
// lossless fabric the two agree whenever the model keeps up with the
// timeout. The port's active MTU is 1024 on a VMware device (its
// vmxnet3's 1500-byte Ethernet) [unverified] and 4096 in QEMU mode (QEMU
// passes its backend's port through: the bench's runs at 4096); UD
// payloads above it fail with LOC_LEN_ERR. Inline data is not supported (the INLINE flag is
// ignored, as QEMU does). GSI QPs are created but complete every send in
// error (MADs are not modelled; QEMU: GENERAL_ERR/0x206).
//
// # Lifecycle and concurrency
//
// A Device and its Functions are safe for concurrent use. Close the
// driver before the Device: Device.Close frees every DMA buffer, the
// driver's rings included. Device.Close stops the device goroutine; no
// goroutine outlives it. The package never prints or logs.
package pvsim
