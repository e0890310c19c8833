package perf

import (
	"math"
	"slices"
	"time"
)

// Quantile returns the q-quantile of d by nearest rank: the smallest value
// of d that at least a fraction q of d's values are at or below. Of d
// sorted, that is d[⌈q·n⌉−1] for n values, clamped to d[0] (q of 0 or
// less: the minimum) and d[n−1] (q of 1 or more: the maximum). So the
// median (q 0.5) of an even count is the lower of the two middle values,
// of one value that value; the 99th percentile of 100 values is the 99th
// smallest. q·n is taken to the nearest integer when within 1e-9 of it
// (0.07·100 is 7.000000000000001 in floating point: the 7th, not the
// 8th). It sorts d in place; an empty d gives 0.
func Quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[rank(len(d), q)]
}

// Median is Quantile(d, 0.5).
func Median(d []time.Duration) time.Duration { return Quantile(d, 0.5) }

// rank is the index of the q-quantile of n sorted values.
func rank(n int, q float64) int {
	x := q * float64(n)
	if r := math.Round(x); math.Abs(x-r) < 1e-9 {
		x = r
	}
	return max(0, min(int(math.Ceil(x))-1, n-1))
}

// US returns d in microseconds.
func US(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// PerMessage returns d in microseconds per message, 0 for no messages.
func PerMessage(d time.Duration, messages int) float64 {
	if messages <= 0 {
		return 0
	}
	return US(d) / float64(messages)
}

// Rate returns n per second of d, 0 for no time.
func Rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
