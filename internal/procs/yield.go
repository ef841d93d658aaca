package procs

import (
	"runtime"
	"time"
)

// yieldEvery is how often a Yielder lets its goroutine be scheduled: well
// under the runtime's forcePreemptNS (10ms), so that sysmon never sees the
// goroutine's P go that long without a scheduling.
const yieldEvery = 4 * time.Millisecond

// yieldCheck is how many ticks pass between two looks at the clock.
const yieldCheck = 4

// A Yielder keeps a locked event-loop thread from looking stuck to the Go
// runtime. Such a loop never goes through the scheduler: it sleeps in
// io_uring_enter and returns from it with the P it held. Every 10ms
// without a scheduling on its P, sysmon then preempts it (a signal) and,
// if it is in the system call, hands its P to another thread; and each
// such retake resets sysmon to polling every 20µs for the next
// millisecond or more. With one loop per CPU, sysmon never calms down: on
// the lab's emulated CPUs it took about a third of the client daemon's CPU
// time, in nanosleep (about a tenth with a Yielder in each loop). Calling
// runtime.Gosched every few milliseconds costs two thread wake-ups each
// time and keeps sysmon asleep.
//
// The zero value is ready; a Yielder belongs to one goroutine.
type Yielder struct {
	ticks uint32
	next  time.Time
}

// Tick is called once per loop iteration; now and then it yields the
// processor to the scheduler, which hands it straight back.
func (y *Yielder) Tick() {
	y.ticks++
	if y.ticks%yieldCheck != 0 {
		return
	}
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
