//go:build race

package vfio

// raceEnabled: the race detector instruments code and adds allocations.
const raceEnabled = true
