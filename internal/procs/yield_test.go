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

// yieldGaps ticks a Yielder at the given iteration durations on a
// synthetic clock and returns the yields' count and their largest gap.
func yieldGaps(t *testing.T, iters func(i int) time.Duration, n int) (yields int, maxGap time.Duration) {
	var y Yielder
	now := time.Unix(1e9, 0)
	var lastYield time.Time
	var count int
	gosched = func() {
		if !lastYield.IsZero() {
			maxGap = max(maxGap, now.Sub(lastYield))
		}
		lastYield = now
		count++
	}
	t.Cleanup(func() { gosched = runtimeGosched })
	for i := range n {
		y.tick(now)
		now = now.Add(iters(i))
	}
	return count, maxGap
}

func TestYielderFastLoop(t *testing.T) {
	// 1s of 10µs iterations: one yield per budget, no more.
	yields, gap := yieldGaps(t, func(int) time.Duration { return 10 * time.Microsecond }, 100000)
	if want := int(time.Second/yieldBudget) + 1; yields < want-1 || yields > want+1 {
		t.Errorf("%d yields in 1s of 10µs iterations, want %d±1", yields, want)
	}
	if gap > yieldBudget {
		t.Errorf("largest gap between yields %v, want <= %v", gap, yieldBudget)
	}
}

func TestYielderSlowLoop(t *testing.T) {
	// 4ms iterations (the lab's emulated CPUs): every second one yields,
	// 8ms apart, where a yield per budget would let sysmon in at 12ms.
	yields, gap := yieldGaps(t, func(int) time.Duration { return 4 * time.Millisecond }, 250)
	if yields < 124 || yields > 126 {
		t.Errorf("%d yields in 250 iterations of 4ms, want 125±1", yields)
	}
	if gap != 8*time.Millisecond {
		t.Errorf("gap between yields %v, want 8ms", gap)
	}
}

func TestYielderUnevenLoop(t *testing.T) {
	// Iterations of 1 to 1.5ms: never 10ms (forcePreemptNS) without one.
	_, gap := yieldGaps(t, func(i int) time.Duration {
		return time.Millisecond + time.Duration(i*7919%500)*time.Microsecond
	}, 10000)
	if gap >= 10*time.Millisecond {
		t.Errorf("largest gap between yields %v, want < 10ms", gap)
	}
}

func TestYielderLongIterationYieldsNext(t *testing.T) {
	// An iteration longer than the budget (a long wait): the tick after
	// it yields, and the next short ones do not.
	d := []time.Duration{time.Microsecond, 20 * time.Millisecond, time.Microsecond, time.Microsecond, time.Microsecond}
	yields, _ := yieldGaps(t, func(i int) time.Duration { return d[i] }, len(d))
	if yields != 2 { // the first tick and the one after the long wait
		t.Errorf("%d yields, want 2", yields)
	}
}

func TestYielderTick(t *testing.T) {
	n := countYields(t)
	var y Yielder
	y.Tick()
	y.Tick()
	if *n != 1 {
		t.Errorf("%d yields after two quick ticks, want 1 (the first)", *n)
	}
}

// BenchmarkYielderTick is the cost a Yielder adds to each loop iteration
// (a clock read and a comparison; yields replaced by a counter).
func BenchmarkYielderTick(b *testing.B) {
	yields := 0
	gosched = func() { yields++ }
	b.Cleanup(func() { gosched = runtimeGosched })
	var y Yielder
	b.ReportAllocs()
	for b.Loop() {
		y.Tick()
	}
	b.ReportMetric(float64(yields)/b.Elapsed().Seconds(), "yields/s")
}
