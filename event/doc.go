// Package event gathers completion events from many sources into one place
// to poll and one thing to sleep on: libfabric's poll sets, wait sets,
// counters and trywait (fi_poll(3), fi_cntr(3)), for services that hold
// hundreds of queues and cannot spin on each or park a goroutine per queue.
//
// A Source is anything that has events: a CQ (vfrdma.CQ.Source: it holds
// completions), a *Counter (its value moved), or something built on them.
// Sources tell the Wakers that watch them when they may have new events.
//
//   - A PollSet progresses its members and returns the caller's context of
//     each one that has events: CQs that are not empty, counters that
//     counted since the last Poll. Members whose source can be armed go
//     idle after a while and cost nothing until their source wakes them.
//   - A WaitSet is one wait object for all its members: an fd for
//     select/poll/epoll (the default), a channel for Go code, or a yield
//     loop for latency-bound services.
//   - TryWait arms every member and reports whether it is safe to sleep:
//     nil when nothing is pending, ErrAgain when events are queued. The
//     sequence TryWait, then a sleep on the wait object, never sleeps
//     through an event that came before or during TryWait.
//   - A Counter has a success and an error value. Bound to a QP's sends or
//     receives (vfrdma.QPConfig.SendCounter, RecvCounter), it counts their
//     completions; given the QP's CQ to Drive (a CQ in vfrdma.CQCounted
//     mode), it makes that progress itself, so a service that only reads
//     counters never polls the CQ.
//
// The sets live below the root package, which gives its CQ as a Source
// (vfrdma.CQSource), so that higher layers (active messages) can be
// members too.
//
// # Lifecycle
//
// One rule for PollSet, WaitSet and Counter, the project's: after Close,
// every method that returns an error returns one wrapping ErrClosed (the
// driver's vfrdma.ErrClosed); a second Close returns nil; a call racing
// Close either completes or returns ErrClosed; Close releases every
// goroutine asleep in Wait with ErrClosed, and frees nothing a call may
// still use. Close is refused with ErrBusy while the object is in use: a
// set with members, a counter bound to a QP or held by a set.
//
// Wait never outlives its ctx. The zero Counter and the zero PollSet are
// ready to use (as am.Counter's zero value is); a WaitSet is made by
// NewWaitSet.
//
// # File descriptors
//
// An fd the package hands out (WaitSet.FD, Counter.FD, and through them a
// CQ's FD) is a new dup of the wait object's eventfd, the caller's to
// close: closing it never affects the set or anyone else, and the set never
// closes a number it did not make. If the set's own eventfd dies (EBADF:
// code closed a number it did not own), TryWait, Wait and FD report the
// error instead of spinning, and the set leaves that number alone.
package event
