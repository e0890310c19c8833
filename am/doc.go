// Package am is active messages with IBM LAPI's LAPI_Amsend semantics over
// vfrdma: a job of tasks, one Context each, where a message names a header
// handler at its target that decides where the data goes.
//
// # Use
//
//	c, err := am.New(ctx, dev, am.Config{Tasks: n, Self: i, Exchange: x})
//	c.SetHandler(1, func(a *am.Arrival) am.Return {
//		buf := make([]byte, a.Len)
//		return am.Return{Buf: buf, Completion: func() { use(buf) }}
//	})
//	org, cmpl := am.NewCounter(), am.NewCounter()
//	err = c.Amsend(tgt, 1, uhdr, data, am.Counters{Tgt: 3, Org: org, Cmpl: cmpl})
//	_, err = cmpl.Wait(ctx, 1) // the target's completion handler has run
//
// The rules, and where they are kept:
//   - A header handler registered at an index (SetHandler, the same index
//     on every task) runs on the progress goroutine when a message's first
//     packet arrives, with the user header and the message length. It
//     returns the buffer for the data, and optionally a completion handler,
//     which runs once the data is all in: on a goroutine of its own, or
//     inline on the progress goroutine when the header handler asks. For a
//     message that came in one packet (Arrival.Data) it may return no buffer
//     and consume the data in the call.
//   - Counters: Org counts when the origin's buffers may be reused, the
//     target counter (named by index, SetCounter) after the completion
//     handler returned, Cmpl at the origin once the target's
//     acknowledgement says so. Counter.Wait takes what it waited for back
//     out (LAPI_Waitcntr).
//   - Amsend checks its arguments first and returns a distinct error with
//     nothing sent: ErrDataLen, ErrUHdrLen, ErrNoHandler, ErrTarget,
//     ErrCounter, ErrPurged, ErrClosed.
//   - Sending to yourself goes through the device like any other message.
//
// # Under a launcher
//
// Tasks that a cluster's launcher starts find each other through
// LauncherExchanger(os.Getenv): each takes its rank and size from the
// variables the launcher set (Slurm's srun: SLURM_PROCID and
// SLURM_STEP_NUM_TASKS; Open MPI's mpirun: OMPI_COMM_WORLD_RANK and
// OMPI_COMM_WORLD_SIZE; MPICH's mpiexec and srun --mpi=pmi2: PMI_RANK and
// PMI_SIZE; PMIx: PMIX_RANK), task 0's host:port from VFRDMA_AM_ADDR, and
// the job's token from VFRDMA_AM_TOKEN or else the launcher's job id
// (SLURM_JOB_ID and SLURM_STEP_ID, PMIX_NAMESPACE, PMI_JOBID), which the
// tasks of one job share and other jobs do not. Run it as
// "VFRDMA_AM_ADDR=node01:7470 srun -n 4 ./mysvc" (or with VFRDMA_AM_PORT
// alone, for task 0 on the step's first node) or as "mpirun -n 4 -x
// VFRDMA_AM_ADDR=node01:7470 ./mysvc"; mpiexec sets no job id, so give it
// VFRDMA_AM_TOKEN too. An MPI launcher's variables win over Slurm's
// (mpirun inside an allocation passes its tasks Slurm variables that
// number its daemons); LauncherExchanger has the rules and the errors.
//
// # Protocol
//
// Each pair of tasks has one RC QP at each end (a task has two to itself,
// connected to each other); every receive buffer comes from one SRQ of
// Tasks × Credits buffers of PacketSize bytes. A packet is one SEND: a
// 32-byte header (see wire.go), then for a message's first packet the user
// header, then data. A message that fits in one packet goes eager; a longer
// one goes as a first packet and fragments, each naming the message and its
// offset, copied at the target into the header handler's buffer. Messages
// to one task go in order, one after the other.
//
// Credits keep a receiver from ever running out of buffers (no RNR, no
// drop): a task may have at most Credits packets unreturned at a peer.
// Every packet carries the credits its sender owes back (one per buffer it
// reposted). A data packet never takes the last credit, and a credit-only
// packet takes it only if it returns at least one, so two tasks can never
// both wait for the other's credits.
//
// The target acknowledges each message after its completion handler
// returned; the acknowledgement drives Cmpl and Fence. A message's first
// packet carries up to two acknowledgements for its target, so that in a
// request and answer exchange each message acknowledges the one before
// it. A packet of acknowledgements and credits alone goes when half a
// packet of acknowledgements or half the credits have gathered, or when
// the progress goroutine runs out of work with acknowledgements waiting
// that their origin waits for (the message had a Cmpl counter) or that
// have waited 200 µs for a data packet to ride on (at most half the spin: a
// goroutine that does not spin holds nothing back; one queued while the
// goroutine naps goes at its first wake after that, a nap being at most
// 1 ms). A Fence therefore waits at most that much longer for messages
// sent without Cmpl.
//
// Packets are posted deferred and one doorbell rings per QP per round of
// sending; an Amsend made while the progress goroutine runs a round of
// handlers goes at the round's end, with what the round gathered. Taken
// buffers go back to the SRQ 16 at a time (at most half the credits),
// or once the goroutine has been idle for the same 200 µs (at once when
// idle, for a goroutine that does not spin), one doorbell each time;
// their credits go back after them.
//
// # Progress
//
// A goroutine per Context polls its CQ, runs header handlers, reposts
// buffers (one SRQ doorbell per batch) and sends what credits allow. Idle,
// it waits as the policy New chose says (ProgressMode names it): it polls
// on (Config.Polling); spins for Config.Spin, then sleeps on the CQ's
// interrupt through an event.WaitSet (TryWait, then sleep); sleeps at
// once (no spin); or, on a CQ that cannot be armed, spins, then naps.
// schedule.go holds the policies and the rules for when data,
// acknowledgements, credits and probes go; wire.go the packet layout.
//
// # Failures
//
// An RC send to a task that is gone fails after the QP's retries (well
// under a second on the bench); the task is then purged: what was queued or
// unacknowledged to it fails, Fence returns ErrPurged joined with the
// count, Amsend to it returns ErrPurged, Barrier returns ErrPurged.
// Counters count only what was delivered. Purge does the same on request.
//
// A peer is another process, and the device's completions are its word:
// every packet and completion is checked before use (a packet fits a
// receive buffer of PacketSize bytes; a message's user header and length
// are within this task's MaxUHdr and MaxMessage; a fragment continues its
// message, with the same length, at the offset reached; a message comes
// with the next id; credits come back only as taken; a completion names a
// buffer or slot in flight and a length within it). A task whose packet
// does not hold together is refused: purged as above (its later packets
// are dropped unread, and it is owed no credits), counted in
// Stats.Refused, and Fence reports why; the process never panics on it.
//
// # Lifecycle
//
// The project's rule: after Close every method returns an error wrapping
// ErrClosed (which is vfrdma.ErrClosed), and a call racing Close completes
// or returns ErrClosed. Close the context before its device: a device
// closed under a live context fails the context with an error wrapping
// ErrClosed (its progress goroutine ends within a quarter of a second;
// every call returns that error); Close still frees the context's own
// packet memory, which stays mapped until then. The zero Counter is ready
// to use, as event.Counter's is.
//
// A destroy the device refuses (a command error; every one, once the
// device raised DEVICE_FATAL) leaves that object with the device, as the
// driver's objects do: Close returns the error, and a later Close retries
// what is left (a Close after one that freed everything returns nil). The
// packet memory of an MR the device did not deregister stays mapped, since
// the device may still reach it, until a later Close deregisters the MR or
// the device is closed: the device's Close destroys (or, dead, shuts)
// what it kept and then frees that memory (Device.AfterClose), whether
// or not the context's Close is called again. So the order context, then
// device, leaks nothing, even after DEVICE_FATAL; and the same holds for
// what New's clean-up could not undo (New's error names it), which stays
// until the device's Close.

package am
