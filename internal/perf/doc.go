// Package perf is the benchmark engine of this module's tools and
// benchmarks: how a loop waits for completions (Wait), the windowed
// sender that times each message from its post to its completion (Send),
// the receive loop that keeps receives posted and counts what arrives
// (Receive), the watch that ends a loop whose peer went quiet
// (WatchQuiet), the process's CPU time (ReadCPU), and the one definition
// of a quantile (Quantile, nearest rank).
//
// pvctl's pingpong, bench and am compose it; am's benchmarks and pvvm's
// round-trip breakdown take their quantiles from it. It prints nothing:
// its callers own their output formats.
package perf
