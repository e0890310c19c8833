package perf

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Quantile is the nearest rank: the smallest value at or below which at
// least a fraction q of the values lie. Its edges: no value (0), one
// value (every quantile is it), two values (the median is the lower, the
// 99th percentile the upper), p0 (the minimum) and p100 (the maximum),
// and a q outside [0, 1] clamped to them.
func TestQuantileIsTheNearestRankAtItsEdges(t *testing.T) {
	us := func(vs ...int) []time.Duration {
		d := make([]time.Duration, len(vs))
		for i, v := range vs {
			d[i] = time.Duration(v) * time.Microsecond
		}
		return d
	}
	for _, tc := range []struct {
		name string
		d    []time.Duration
		q    float64
		want time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"one, p0", us(7), 0, 7 * time.Microsecond},
		{"one, median", us(7), 0.5, 7 * time.Microsecond},
		{"one, p100", us(7), 1, 7 * time.Microsecond},
		{"two, p0", us(9, 3), 0, 3 * time.Microsecond},
		{"two, median", us(9, 3), 0.5, 3 * time.Microsecond},
		{"two, just past the median", us(9, 3), 0.5000001, 9 * time.Microsecond},
		{"two, p99", us(9, 3), 0.99, 9 * time.Microsecond},
		{"two, p100", us(9, 3), 1, 9 * time.Microsecond},
		{"three, median", us(5, 1, 3), 0.5, 3 * time.Microsecond},
		{"below 0", us(5, 1, 3), -1, time.Microsecond},
		{"above 1", us(5, 1, 3), 2, 5 * time.Microsecond},
	} {
		assert.Equal(t, tc.want, Quantile(tc.d, tc.q), tc.name)
	}
	d := make([]time.Duration, 100)
	for i := range d {
		d[i] = time.Duration(100-i) * time.Microsecond // 100 µs down to 1 µs
	}
	assert.Equal(t, 50*time.Microsecond, Median(d), "the 50th of 100")
	assert.Equal(t, 99*time.Microsecond, Quantile(d, 0.99), "the 99th of 100")
	assert.Equal(t, 100*time.Microsecond, Quantile(d, 1))
	assert.Equal(t, time.Microsecond, Quantile(d, 0))
	assert.Equal(t, 7*time.Microsecond, Quantile(d, 0.07), "0.07·100 is 7 in floating point only to within 1e-15: the 7th")
	assert.Equal(t, 8*time.Microsecond, Quantile(d, 0.0701), "past 7 values: the 8th")
	assert.Equal(t, time.Microsecond, d[0], "sorted in place")
}

// The per-message figures divide by nothing without failing.
func TestPerMessageFiguresOfNothingAreZero(t *testing.T) {
	assert.InDelta(t, 2.5, PerMessage(5*time.Microsecond, 2), 1e-12)
	assert.Zero(t, PerMessage(time.Second, 0))
	assert.InDelta(t, 500.0, Rate(1000, 2*time.Second), 1e-9)
	assert.Zero(t, Rate(1000, 0))
	assert.InDelta(t, 1.5, US(1500*time.Nanosecond), 1e-12)
}
