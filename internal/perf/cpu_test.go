package perf

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A CPU reading is user and system time; the difference of two is taken
// field by field, the microseconds carried across seconds.
func TestCPUSinceIsTheDifferenceOfTwoReadings(t *testing.T) {
	before := CPUOf(&unix.Rusage{
		Utime: unix.Timeval{Sec: 1, Usec: 900000},
		Stime: unix.Timeval{Sec: 0, Usec: 999999},
	})
	after := CPUOf(&unix.Rusage{
		Utime: unix.Timeval{Sec: 2, Usec: 100000}, // the microseconds wrap
		Stime: unix.Timeval{Sec: 1, Usec: 250000},
	})
	d := after.Since(before)
	assert.Equal(t, 200*time.Millisecond, d.User)
	assert.Equal(t, 250001*time.Microsecond, d.Sys)
	assert.Equal(t, 450001*time.Microsecond, d.Total(), "user plus system")
	assert.Equal(t, CPU{}, after.Since(after))
}

// ReadCPU reads the process's time: spinning moves it.
func TestReadCPUMovesWhenTheProcessRuns(t *testing.T) {
	c0, err := ReadCPU()
	require.NoError(t, err)
	for c1 := c0; c1.Since(c0).Total() <= 0; {
		for end := time.Now().Add(time.Millisecond); time.Now().Before(end); {
		}
		c1, err = ReadCPU()
		require.NoError(t, err)
	}
}
