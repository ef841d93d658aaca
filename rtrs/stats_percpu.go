package rtrs

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// statsCacheLine is the cache line size the per-CPU slots are padded to.
// Every slot starts with one full line of padding and is a multiple of a
// line long, so the counters of two CPUs never share a line whatever the
// alignment of the slot array (the Go allocator only guarantees 8 bytes).
const statsCacheLine = 64

// statsCPU maps the CPU number given by the caller to a slot index in
// [0, n). In range it is the identity; a CPU number outside the range (a CPU
// hot-added after the stats were created, or a bogus -1) is folded in
// rather than trusted, so an update can never index out of bounds.
func statsCPU(cpu, n int) int {
	if uint(cpu) < uint(n) {
		return cpu
	}
	return int(uint(cpu) % uint(n))
}

// statsMax raises a to v if v is larger (lock-free, no allocation).
func statsMax(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

var possibleCPUs = sync.OnceValue(func() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err == nil {
		if n := parseCPUList(strings.TrimSpace(string(b))); n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
})

// StatsPossibleCPUs is the number of possible CPUs of this machine (the
// highest CPU number in /sys/devices/system/cpu/possible plus one, or
// runtime.NumCPU() when that file cannot be read). It is the default
// number of per-CPU slots and of columns in the per-CPU stats files, as
// the kernel prints one column per possible CPU (for_each_possible_cpu).
func StatsPossibleCPUs() int { return possibleCPUs() }

// parseCPUList returns the highest CPU of a kernel CPU list ("0-7",
// "0,2-3") plus one, or 0 if s is malformed.
func parseCPUList(s string) int {
	if s == "" {
		return 0
	}
	highest := -1
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return 0
		}
		highest = max(highest, b)
	}
	return highest + 1
}
