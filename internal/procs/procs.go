// Package procs adapts the Go scheduler to OS threads that are locked to
// an event loop and spend most of their time blocked in a system call
// (io_uring_enter waiting for completions): AddBlockingThread gives the
// scheduler one more P for each, and a Yielder lets each be scheduled now
// and then, so that the runtime does not take it for a goroutine that has
// run too long.
//
// Such a thread keeps its P while it sleeps in the kernel. When every P is
// held that way (GOMAXPROCS=2 with two queue threads), the process's other
// goroutines find no P to run on until the runtime's sysmon retakes one
// from a sleeping thread, 20µs or more later, and sysmon keeps polling
// every 20µs because it retook something; each wake-up of a queue thread
// then has to get a P back. With a spare P per such thread there is always
// an idle one. Measured on a 2-CPU host: tools/rtrsbench over TCP, whose
// RTRS server goroutines share the process with two client queue threads,
// went from about 200k to 400k 4k random reads per second.
package procs

import (
	"runtime"
	"sync"
)

var mu sync.Mutex

// AddBlockingThread raises GOMAXPROCS by one; call the returned function
// (once) when the thread's loop ends. It stops the world briefly: call it
// when a queue starts, not per request.
func AddBlockingThread() (release func()) {
	mu.Lock()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			if n := runtime.GOMAXPROCS(0); n > 1 {
				runtime.GOMAXPROCS(n - 1)
			}
			mu.Unlock()
		})
	}
}
