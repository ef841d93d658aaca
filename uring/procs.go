package uring

import (
	"runtime"
	"sync"
)

// loopProcs counts the open rings made by NewLoop and raises GOMAXPROCS
// by as many: a loop's thread is locked and spends most of its time
// blocked in io_uring_enter, so it needs its P only between waits.
//
// Without the extra P the runtime takes a P from a thread blocked in a
// system call once no P is idle, after 20 µs (sysmon's retake): it wakes
// another thread to spin for work (futex), keeps sysmon polling every
// 20 µs (nanosleep), and makes the loop's thread take a P again when its
// wait returns (futex). With a P idle, a wait shorter than 10 ms keeps
// its P and returns to it without a system call. The lab bench counted
// those futex and nanosleep calls at three times the loops' own system
// calls per I/O, with as many loops as CPUs.
var loopProcs procHolds

type procHolds struct {
	mu   sync.Mutex
	n    int
	base int // GOMAXPROCS before the first
}

// add counts delta more loops.
func (h *procHolds) add(delta int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		h.base = runtime.GOMAXPROCS(0)
	}
	h.n += delta
	runtime.GOMAXPROCS(h.base + h.n)
}
