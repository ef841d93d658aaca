package rnbd

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// CompletionQueue is an RDMA completion queue of a session's block
// queues, with the CPU whose thread polls it: where RTRS wants its
// completions to be raised (the kernel's cpu_migration counts those that
// are not).
type CompletionQueue struct {
	Path int // path index in the session
	// Queue is the RTRS queue index: block*queues + ublk queue.
	Queue int
	// CPU is the CPU the polling thread is pinned to now, TID the
	// thread.
	CPU, TID int
	// UserHandle identifies the CQ to the kernel: libibverbs passes the
	// address of its struct ibv_cq as the CQ's user_handle, which the
	// completion handler's struct ib_cq reaches through its uobject.
	UserHandle uint64
}

// queueThreads records, per RTRS queue, the thread that drives it: the
// ublk queue thread it is attached to (0: none).
type queueThreads []atomic.Int32

func (q queueThreads) set(i, tid int) {
	if i >= 0 && i < len(q) {
		q[i].Store(int32(tid))
	}
}

// cpu returns the thread of queue i and the one CPU it may run on now,
// or -1 (no thread, or allowed on several CPUs). It is read from the thread's
// affinity each time, so that a thread moved with taskset counts where
// it is.
func (q queueThreads) cpu(i int) (cpu, tid int) {
	if i < 0 || i >= len(q) {
		return -1, 0
	}
	tid = int(q[i].Load())
	if tid == 0 {
		return -1, 0
	}
	var set unix.CPUSet
	if unix.SchedGetaffinity(tid, &set) != nil || set.Count() != 1 {
		return -1, tid
	}
	for cpu := 0; ; cpu++ {
		if set.IsSet(cpu) {
			return cpu, tid
		}
	}
}

// CompletionQueues lists the completion queues of the session's block
// queues that are driven by a mapped device's pinned queue thread. A TCP
// session has none.
func (c *Client) CompletionQueues() []CompletionQueue { return c.t.completionQueues() }
