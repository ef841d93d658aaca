package procs

import (
	"testing"
	"time"
)

// countYields makes Yielders count their yields in the returned counter
// instead of calling runtime.Gosched, until the test ends.
func countYields(t *testing.T) *int {
	n := new(int)
	gosched = func() { *n++ }
	t.Cleanup(func() { gosched = runtimeGosched })
	return n
}

func TestYielderCadence(t *testing.T) {
	n := countYields(t)
	var y Yielder
	start := time.Now()
	ticks := 0
	for time.Since(start) < 50*time.Millisecond {
		y.Tick()
		ticks++
		time.Sleep(100 * time.Microsecond)
	}
	elapsed := time.Since(start)
	// One yield at the first clock check, then one per yieldEvery; sleeps
	// may overshoot, so fewer is fine, but never none and never more.
	most := int(elapsed/yieldEvery) + 1
	if *n < 2 || *n > most {
		t.Errorf("%d yields in %v (%d ticks), want 2..%d", *n, elapsed, ticks, most)
	}
}

func TestYielderNotEveryTick(t *testing.T) {
	n := countYields(t)
	var y Yielder
	start := time.Now()
	for range 100000 {
		y.Tick()
	}
	most := int(time.Since(start)/yieldEvery) + 1
	if *n < 1 || *n > most {
		t.Errorf("%d yields in 100000 ticks over %v, want 1..%d", *n, time.Since(start), most)
	}
}
