// Package allocstest counts heap allocations per call for tests of code
// that runs event loops: testing.AllocsPerRun sets GOMAXPROCS to 1 while
// it counts, and a loop whose thread holds its P in a raw wait
// (uring.Ring.SetRawWait) then keeps the test's goroutine from running
// until the runtime preempts it, 10 ms a call.
package allocstest

import "runtime"

// PerRun is testing.AllocsPerRun without changing GOMAXPROCS: the mean
// number of heap allocations, over the whole process, of a call to f,
// after one warm-up call. Other goroutines' allocations count too, as
// with testing.AllocsPerRun, so a test compares against a baseline or
// takes the least of a few measurements.
func PerRun(runs int, f func()) float64 {
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}
