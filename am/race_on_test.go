//go:build race && !guest

package am

// raceEnabled: the race detector slows the tests' goroutines severalfold.
const raceEnabled = true
