//go:build !race

package am

// raceEnabled: the race detector slows the tests' goroutines severalfold.
const raceEnabled = false
