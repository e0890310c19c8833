//go:build !race && !guest

package vfrdma

// raceOn says the race detector is on (see race_on_test.go).
const raceOn = false
