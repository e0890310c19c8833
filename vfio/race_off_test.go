//go:build !race

package vfio_test

// raceEnabled: the race detector instruments code and adds allocations.
const raceEnabled = false
