package perf

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// CPU is a getrusage(RUSAGE_SELF) reading, or the difference of two: the
// whole process's user and system CPU time. RUSAGE_SELF, not
// RUSAGE_THREAD: a loop is a goroutine, which the runtime moves between
// threads, and a sleeping receiver's wake-ups are partly made on other
// threads (the CQ interrupt goroutine, the runtime's poller); the process
// is what the loop costs, and whatever else runs in it.
type CPU struct {
	User, Sys time.Duration
}

// CPUOf converts a getrusage reading.
func CPUOf(ru *unix.Rusage) CPU {
	return CPU{User: time.Duration(ru.Utime.Nano()), Sys: time.Duration(ru.Stime.Nano())}
}

// ReadCPU reads the process's CPU time so far.
func ReadCPU() (CPU, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return CPU{}, fmt.Errorf("getrusage: %w", err)
	}
	return CPUOf(&ru), nil
}

// Since returns what was used between before and c.
func (c CPU) Since(before CPU) CPU {
	return CPU{User: c.User - before.User, Sys: c.Sys - before.Sys}
}

// Total is user plus system time.
func (c CPU) Total() time.Duration { return c.User + c.Sys }
