package procs

import (
	"runtime"
	"time"
)

// yieldBudget is the longest a Yielder lets its goroutine go without a
// scheduling: under the runtime's forcePreemptNS (10ms), after which
// sysmon preempts it, with room for an iteration a little longer than
// those before it.
const yieldBudget = 9 * time.Millisecond

// A Yielder keeps a locked event-loop thread from looking stuck to the Go
// runtime. Such a loop never goes through the scheduler: it sleeps in
// io_uring_enter and returns from it with the P it held. Every 10ms
// without a scheduling on its P, sysmon then preempts it (a signal) and,
// if it is in the system call, hands its P to another thread; and each
// such retake resets sysmon to polling every 20µs for the next
// millisecond or more. With one loop per CPU, sysmon never calms down: on
// the lab's emulated CPUs it took about a third of the client daemon's CPU
// time, in nanosleep (a tenth to a quarter with a Yielder in each loop).
//
// Each yield costs about four futex calls and two context switches (the
// locked thread hands its P to another thread, which hands the goroutine
// back), so a Yielder yields as seldom as it can: at the last iteration
// that it expects to start before the budget runs out, by the longest
// iteration since its last yield. In the lab (rxe, 7.3, 4k QD32) a fixed
// 4ms cadence cost the client daemon 0.61-0.64 futex calls per I/O; 9ms,
// 0.36-0.44; no Yielder, 0.18-0.23 but 2.5 times sysmon's wake-ups and a
// signal every 10ms per loop.
//
// A Yielder helps only a loop that goes round: one that sleeps 10ms or
// more in a single wait, because it has nothing to do (the queue of a CPU
// that issues no I/O), is preempted all the same.
//
// The zero value is ready; a Yielder belongs to one goroutine.
type Yielder struct {
	due     time.Time     // when the budget since the last yield runs out
	last    time.Time     // the previous tick
	longest time.Duration // the longest iteration since the last yield
}

// Tick is called once per loop iteration; now and then it yields the
// processor to the scheduler, which hands it straight back.
//
// It reads the clock each time (a vDSO call, cheap next to the system call
// of a loop iteration): an iteration can take milliseconds, as on the
// lab's emulated CPUs.
func (y *Yielder) Tick() { y.tick(time.Now()) }

func (y *Yielder) tick(now time.Time) {
	if !y.last.IsZero() {
		y.longest = max(y.longest, now.Sub(y.last))
	}
	y.last = now
	if now.Add(y.longest).Before(y.due) {
		return // the next tick is expected within the budget
	}
	y.due = now.Add(yieldBudget)
	y.longest = 0
	gosched()
}

var (
	runtimeGosched = runtime.Gosched
	gosched        = runtimeGosched // replaced in tests
)
