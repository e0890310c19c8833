// Package wq is the work-queue machinery that a queue pair's send and
// receive queues and a shared receive queue have in common: the ring a
// poster fills, its doorbell with deferred posts, the record of work
// requests posted and not yet completed, and the checks every request passes
// before it touches the ring (SGE count, local key, protection domain,
// bounds, access).
//
// It sits below the root package and the srq package so that both build on
// one copy of it. It knows nothing of the device's command channel.
//
// # Lifecycle and concurrency
//
// A Queue is set up once with Init over ring memory the caller owns (DMA
// memory shared with the device, or ordinary memory in tests). Its post
// side (Put*, End, Fail, Ring) is single-owner; its completion side
// (Complete, Reap, BeginFlush, PopFlush, OutstandingP) belongs to one
// poller, which may run on another goroutine than the poster: the two meet
// only through atomic counters. A Table is safe for concurrent use: readers never lock, writers
// serialise among themselves (the caller's mutex).
//
// # Device-shared memory
//
// The ring's data and state are written by the poster and read by the
// device at any time after a doorbell; a WQE is written in full before the
// producer index that publishes it (rings.Producer orders the two).
package wq
