package rtrs

import (
	"sync/atomic"
	"syscall"
	"time"
)

// Carrier is the transport half of a RequestQueue: it knows the queue's
// connections (C, one per path, compared to tell them apart) and how to
// put a request on one. Its methods but Wake run on the queue's thread.
type Carrier[C comparable] interface {
	// Pick returns the queue's connection on the path the multipath
	// policy picks, not the path with index skip unless it is the only
	// usable one (skip < 0: any), or false when no path is usable.
	Pick(skip int) (C, bool)
	// Send queues r, which holds a permit and is now carried by c, on c
	// and counts it in flight on c's path. An error means r cannot be
	// encoded: it then ends with -EINVAL. Send may fail c (through
	// RequestQueue.FailOver), r included.
	Send(r *Request, c C) error
	// Wake asks the queue's thread to call RetryWaiting soon. It is
	// called from other queues' threads, when they return a permit while
	// this queue starves for one.
	Wake()
	// Hope reports whether some path of the session carries requests or
	// may again without the user's help (PathHasHope); without hope,
	// waiting requests fail with -ENOTCONN.
	Hope() bool
}

// QueueSet is what the RequestQueues of one client session share: the
// session's Permits (the server's chunks, the credits), and the wake-ups
// of queues whose requests starve for one.
type QueueSet struct {
	permits  *Permits
	starving atomic.Int32 // queues with requests waiting for a permit
	queues   []*starvation
	reserve  int // permits kept for the admin queue (SetAdmin): AdminReserve once there is one
}

// NewQueueSet returns the set of a session with the given permits.
func NewQueueSet(permits *Permits) *QueueSet { return &QueueSet{permits: permits} }

// Permits returns the session's permits.
func (s *QueueSet) Permits() *Permits { return s.permits }

// starvation is the part of a queue other queues look at.
type starvation struct {
	starved atomic.Bool // requests wait for a permit
	kicked  atomic.Bool // woken, and not yet retried
	wake    func()
}

// kickStarved wakes the queues (other than from) whose requests wait for a
// permit, each once until it has retried. It only runs under permit
// exhaustion, so not on the common path.
func (s *QueueSet) kickStarved(from *starvation) {
	for _, o := range s.queues {
		if o != from && o.starved.Load() && !o.kicked.Swap(true) {
			o.wake()
		}
	}
}

// RequestQueue is the transport-neutral half of a client queue: the
// requests it has in flight, by permit, and the connection carrying each;
// the requests waiting for a permit or a usable path; failover of a failed
// connection's requests; completion. A request keeps its permit (its
// server chunk) across failovers, so it is re-sent with the same chunk.
//
// All its methods must be called on the queue's thread; none allocates.
type RequestQueue[C comparable] struct {
	id      int
	set     *QueueSet
	carrier Carrier[C]
	reqs    []*Request // by permit: this queue's requests holding one
	via     []C        // by permit: the connection carrying it, or zero
	waiting ReqList    // requests without a permit or a usable path
	st      starvation
	closed  bool
	admin   bool // may take the last permit (SetAdmin)
}

// NewRequestQueue returns queue id of set. Make all queues of a session
// before submitting requests on any of them.
func NewRequestQueue[C comparable](set *QueueSet, id int, carrier Carrier[C]) *RequestQueue[C] {
	n := set.permits.Len()
	q := &RequestQueue[C]{id: id, set: set, carrier: carrier, reqs: make([]*Request, n), via: make([]C, n)}
	q.st.wake = carrier.Wake
	set.queues = append(set.queues, &q.st)
	return q
}

// AdminReserve is how many permits only an admin queue (SetAdmin) may
// take: with every other permit held by IO that waits (a session that
// reconnected holds its IO until its devices are reopened, and reopening
// them takes an admin request), the admin request still gets one.
const AdminReserve = 1

// SetAdmin makes q the session's admin queue: from now on the other
// queues leave AdminReserve permits to it. Call it before any queue runs.
func (q *RequestQueue[C]) SetAdmin() {
	q.admin = true
	if q.set.permits.Len() > AdminReserve {
		q.set.reserve = AdminReserve
	}
}

// ID returns the queue's index, which is also its CPU index in the path
// statistics.
func (q *RequestQueue[C]) ID() int { return q.id }

// Submit starts r, which the transport has checked: it is sent at once if
// a permit and a path are free and no earlier request waits, else it
// waits.
func (q *RequestQueue[C]) Submit(r *Request) {
	r.permit, r.failovers, r.start = -1, 0, nanotime()
	if !q.waiting.Empty() || !q.send(r, -1) {
		q.waiting.Push(r)
	}
}

// send takes a permit if r has none and hands r to the connection the
// carrier picks (avoiding path skip). It returns false if r must wait.
func (q *RequestQueue[C]) send(r *Request, skip int) bool {
	if r.permit < 0 {
		id, ok := q.set.permits.Get(q.id)
		if ok && !q.admin && q.set.reserve > 0 && q.set.permits.InUse() > q.set.permits.Len()-q.set.reserve {
			// The last permits are the admin queue's: give it back.
			q.set.permits.Put(id)
			ok = false
		}
		if !ok {
			if !q.st.starved.Swap(true) {
				q.set.starving.Add(1)
			}
			return false
		}
		r.permit = id
		q.reqs[id] = r
	}
	c, ok := q.carrier.Pick(skip)
	if !ok {
		return false
	}
	// Recorded before Send, which may fail c and fail r over with it.
	q.via[r.permit] = c
	if err := q.carrier.Send(r, c); err != nil {
		var zero C
		q.via[r.permit] = zero
		q.Finish(r, -int(syscall.EINVAL))
	}
	return true
}

// InFlight returns the request holding permit id on this queue and the
// connection carrying it; nil if this queue has no request there (the
// answer of a request that already failed over, or garbage).
func (q *RequestQueue[C]) InFlight(id uint32) (*Request, C) {
	if int(id) >= len(q.reqs) {
		var zero C
		return nil, zero
	}
	return q.reqs[id], q.via[id]
}

// Complete ends r, answered on a connection of the path whose statistics
// are st: it leaves the path's in-flight count, its bytes and latency are
// recorded (with its scatter-gather entries), and it finishes with errno.
func (q *RequestQueue[C]) Complete(r *Request, errno int, st *ClientPathStats) {
	st.DecInflight()
	n := uint64(len(r.Usr) + len(r.Data))
	lat := time.Duration(nanotime() - r.start)
	// The data is one contiguous buffer (one registered range over RDMA):
	// one scatter-gather entry, none without data.
	st.RecordSGEntries(q.id, min(len(r.Data), 1))
	if r.Write {
		st.RecordWrite(q.id, n)
		st.RecordWriteLatency(q.id, lat)
	} else {
		st.RecordRead(q.id, n)
		st.RecordReadLatency(q.id, lat)
	}
	q.Finish(r, errno)
}

// Finish returns r's permit (waking queues that starve for one), calls its
// Done and then lets waiting requests go.
func (q *RequestQueue[C]) Finish(r *Request, errno int) {
	if id := r.permit; id >= 0 {
		var zero C
		q.reqs[id], q.via[id] = nil, zero
		q.set.permits.Put(id)
		r.permit = -1
		if q.set.starving.Load() > 0 {
			q.set.kickStarved(&q.st)
		}
	}
	r.Done(r, errno)
	q.RetryWaiting()
}

// FailOver moves the requests carried by c, a connection of path skip
// that failed, to another usable path (skip only if it is the only one),
// with their permits; those that find none wait. st are path skip's
// statistics: they leave its in-flight count and count as failovers.
func (q *RequestQueue[C]) FailOver(c C, skip int, st *ClientPathStats) {
	var zero C
	for id, v := range q.via {
		r := q.reqs[id]
		if v != c || r == nil {
			continue
		}
		st.DecInflight()
		st.RecordFailover(q.id)
		q.via[id] = zero
		r.failovers++
		if !q.send(r, skip) {
			q.waiting.Push(r)
		}
	}
}

// RetryWaiting sends the waiting requests that can go now, in order. When
// the queue is closed or no path has hope left, those still waiting fail
// with -ENOTCONN. The transport calls it after each batch of control
// messages (a path came up, a permit was returned on another queue, ...).
func (q *RequestQueue[C]) RetryWaiting() {
	q.st.kicked.Store(false)
	for r := q.waiting.Pop(); r != nil; r = q.waiting.Pop() {
		if !q.send(r, -1) {
			q.waiting.PushFront(r)
			break
		}
	}
	if !q.waiting.Empty() && (q.closed || !q.carrier.Hope()) {
		for r := q.waiting.Pop(); r != nil; r = q.waiting.Pop() {
			q.Finish(r, -int(syscall.ENOTCONN))
		}
	}
	if q.waiting.Empty() && q.st.starved.Swap(false) {
		q.set.starving.Add(-1)
	}
}

// Close marks the queue closed: from the next RetryWaiting on, waiting
// requests fail with -ENOTCONN instead of waiting for a path.
func (q *RequestQueue[C]) Close() { q.closed = true }

// Closed reports whether Close was called.
func (q *RequestQueue[C]) Closed() bool { return q.closed }

var startTime = time.Now()

// nanotime is a monotonic clock in ns, for request latencies.
func nanotime() int64 { return int64(time.Since(startTime)) }

// Counts returns, for diagnostics, how many requests wait, how many hold a
// permit, and whether the queue starves for permits. It walks the lists:
// not for the data path.
func (q *RequestQueue[C]) Counts() (waiting, inflight int, starved bool) {
	for r := q.waiting.head; r != nil; r = r.next {
		waiting++
	}
	for _, r := range q.reqs {
		if r != nil {
			inflight++
		}
	}
	return waiting, inflight, q.st.starved.Load()
}
