//go:build race && !guest

package vfrdma

// raceOn says the race detector is on: the tests that run a million
// operations run a tenth of them under it (it slows them tenfold), so a
// loaded machine finishes the package within go test's timeout.
const raceOn = true
