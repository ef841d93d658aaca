package rnbd

import "sync/atomic"

// CompletionQueue is an RDMA completion queue of a session's block
// queues, with the CPU whose thread polls it: where RTRS wants its
// completions to be raised (the kernel's cpu_migration counts those that
// are not).
type CompletionQueue struct {
	Path int // path index in the session
	// Queue is the RTRS queue index: block*queues + ublk queue.
	Queue int
	// CPU is the CPU the polling thread is pinned to.
	CPU int
	// UserHandle identifies the CQ to the kernel: libibverbs passes the
	// address of its struct ibv_cq as the CQ's user_handle, which the
	// completion handler's struct ib_cq reaches through its uobject.
	UserHandle uint64
}

// queueCPUs records, per RTRS queue, the CPU of the ublk queue thread
// that drives it (-1: not attached, or not pinned to one CPU).
type queueCPUs []atomic.Int32

func newQueueCPUs(n int) queueCPUs {
	q := make(queueCPUs, n)
	for i := range q {
		q[i].Store(-1)
	}
	return q
}

func (q queueCPUs) set(i, cpu int) {
	if i >= 0 && i < len(q) {
		q[i].Store(int32(cpu))
	}
}

func (q queueCPUs) get(i int) int {
	if i < 0 || i >= len(q) {
		return -1
	}
	return int(q[i].Load())
}

// CompletionQueues lists the completion queues of the session's block
// queues that are driven by a mapped device's pinned queue thread. A TCP
// session has none.
func (c *Client) CompletionQueues() []CompletionQueue { return c.t.completionQueues() }
