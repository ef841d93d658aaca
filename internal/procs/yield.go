package procs

import (
	"runtime"
	"time"
)

// yieldEvery is how often a Yielder lets its goroutine be scheduled: well
// under the runtime's forcePreemptNS (10ms), so that sysmon never sees the
// goroutine's P go that long without a scheduling.
const yieldEvery = 4 * time.Millisecond

// A Yielder keeps a locked event-loop thread from looking stuck to the Go
// runtime. Such a loop never goes through the scheduler: it sleeps in
// io_uring_enter and returns from it with the P it held. Every 10ms
// without a scheduling on its P, sysmon then preempts it (a signal) and,
// if it is in the system call, hands its P to another thread; and each
// such retake resets sysmon to polling every 20µs for the next
// millisecond or more. With one loop per CPU, sysmon never calms down: on
// the lab's emulated CPUs it took about a third of the client daemon's CPU
// time, in nanosleep (a tenth to a quarter with a Yielder in each loop).
// Calling runtime.Gosched every few milliseconds costs two thread wake-ups
// each time and keeps sysmon asleep.
//
// A Yielder helps only a loop that goes round: one that sleeps 10ms or
// more in a single wait, because it has nothing to do (the queue of a CPU
// that issues no I/O), is preempted all the same.
//
// The zero value is ready; a Yielder belongs to one goroutine.
type Yielder struct {
	next time.Time
}

// Tick is called once per loop iteration; now and then it yields the
// processor to the scheduler, which hands it straight back.
//
// It reads the clock each time (a vDSO call, cheap next to the system call
// of a loop iteration): looking only every few ticks let a loop whose
// iterations take milliseconds, as on the lab's emulated CPUs, go past
// 10ms, and sysmon preempted it 50 to 100 times a second.
func (y *Yielder) Tick() {
	now := time.Now()
	if now.Before(y.next) {
		return
	}
	y.next = now.Add(yieldEvery)
	gosched()
}

var (
	runtimeGosched = runtime.Gosched
	gosched        = runtimeGosched // replaced in tests
)
