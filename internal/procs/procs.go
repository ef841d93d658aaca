// Package procs gives the Go scheduler one more P for each OS thread that
// is locked to an event loop and spends most of its time blocked in a
// system call (io_uring_enter waiting for completions).
//
// Such a thread keeps its P while it sleeps in the kernel. When every P is
// held that way (GOMAXPROCS=2 with two ublk queue threads and the RDMA
// admin queue thread), the runtime's sysmon finds no idle P, retakes the
// P of a sleeping thread after 20µs, and keeps polling every 20µs because
// it retook something; each wake-up then has to get a P back. In the lab
// VM this sysmon churn was about a third of the client daemon's and the
// server's CPU time. With a spare P per such thread there is always an idle
// one, sysmon leaves short system calls alone and backs off to 10ms.
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
