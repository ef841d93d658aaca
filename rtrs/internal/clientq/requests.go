package clientq

import (
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// Carrier is the transport half of a RequestQueue: it knows the queue's
// connections (C, one per path, compared to tell them apart) and how to
// put a request on one. Its methods but Wake run on the queue's thread.
type Carrier[C comparable] interface {
	// Pick returns the queue's connection on the path the multipath
	// policy picks, not the path with index skip unless it is the only
	// usable one (skip < 0: any), or false when no path is usable.
	Pick(skip int) (C, bool)
	// Send queues r, which holds permit and is now carried by c, on c
	// and counts it in flight on c's path. An error means r cannot be
	// encoded: it then ends with -EINVAL. Send may fail c (through
	// RequestQueue.FailOver), r included.
	Send(r *rtrs.Request, permit int, c C) error
	// Wake asks the queue's thread to call RetryWaiting soon. It is
	// called from other queues' threads, when they return a permit while
	// this queue starves for one.
	Wake()
	// Hope reports whether some path of the session carries requests or
	// may again without the user's help (session.PathHasHope); without
	// hope, waiting requests fail with -ENOTCONN.
	Hope() bool
}

// QueueSet is what the RequestQueues of one client session share: the
// session's Permits (the server's chunks, the credits), and the wake-ups
// of queues whose requests starve for one.
type QueueSet struct {
	permits  *rtrs.Permits
	starving atomic.Int32 // queues with requests waiting for a permit
	queues   []*starvation
	reserve  int // permits kept for the admin queue (SetAdmin): AdminReserve once there is one
}

// NewQueueSet returns the set of a session with the given permits.
func NewQueueSet(permits *rtrs.Permits) *QueueSet { return &QueueSet{permits: permits} }

// Permits returns the session's permits.
func (s *QueueSet) Permits() *rtrs.Permits { return s.permits }

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
// The queue keeps all it knows of a request itself, by permit or in its
// waiting list, so that rtrs.Request stays the caller's plain struct.
// All its methods must be called on the queue's thread; none allocates
// once the waiting list has grown to the most requests that ever waited.
type RequestQueue[C comparable] struct {
	id      int
	set     *QueueSet
	carrier Carrier[C]
	// By permit: this queue's request holding it, the connection carrying
	// it (zero while it waits), when it was submitted, how often it
	// failed over.
	reqs      []*rtrs.Request
	via       []C
	start     []int64
	failovers []int32
	waiting   fifo // requests without a permit or a usable path
	st        starvation
	closed    bool
	admin     bool // may take the last permit (SetAdmin)
}

// NewRequestQueue returns queue id of set. Make all queues of a session
// before submitting requests on any of them.
func NewRequestQueue[C comparable](set *QueueSet, id int, carrier Carrier[C]) *RequestQueue[C] {
	n := set.permits.Len()
	q := &RequestQueue[C]{id: id, set: set, carrier: carrier, reqs: make([]*rtrs.Request, n),
		via: make([]C, n), start: make([]int64, n), failovers: make([]int32, n)}
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

// Submit starts r, which the transport has checked: it is sent at once if
// a permit and a path are free and no earlier request waits, else it
// waits.
func (q *RequestQueue[C]) Submit(r *rtrs.Request) {
	w := waiter{r: r, permit: -1, start: nanotime()}
	if q.waiting.len() > 0 || !q.send(&w, -1) {
		q.waiting.push(w)
	}
}

// send takes a permit if w has none and hands w's request to the
// connection the carrier picks (avoiding path skip). It returns false if
// the request must wait; w then holds the permit it took, if any.
func (q *RequestQueue[C]) send(w *waiter, skip int) bool {
	if w.permit < 0 {
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
		w.permit = int32(id)
		q.reqs[id], q.start[id], q.failovers[id] = w.r, w.start, 0
	}
	c, ok := q.carrier.Pick(skip)
	if !ok {
		return false
	}
	id := int(w.permit)
	// Recorded before Send, which may fail c and fail the request over
	// with it.
	q.via[id] = c
	if err := q.carrier.Send(w.r, id, c); err != nil {
		var zero C
		q.via[id] = zero
		q.Finish(uint32(id), -int(syscall.EINVAL))
	}
	return true
}

// InFlight returns the request holding permit id on this queue and the
// connection carrying it; nil if this queue has no request there (the
// answer of a request that already failed over, or garbage).
func (q *RequestQueue[C]) InFlight(id uint32) (*rtrs.Request, C) {
	if int(id) >= len(q.reqs) {
		var zero C
		return nil, zero
	}
	return q.reqs[id], q.via[id]
}

// Complete ends the request holding permit id, answered on a connection
// of the path whose statistics are st: it leaves the path's in-flight
// count, its bytes and latency are recorded (with its scatter-gather
// entries), and it finishes with errno. The caller found it with InFlight.
func (q *RequestQueue[C]) Complete(id uint32, errno int, st *rtrs.ClientPathStats) {
	r := q.reqs[id]
	st.DecInflight()
	n := uint64(len(r.Usr) + len(r.Data))
	lat := time.Duration(nanotime() - q.start[id])
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
	q.Finish(id, errno)
}

// Finish returns permit id (waking queues that starve for one), calls the
// Done of the request that held it and then lets waiting requests go.
func (q *RequestQueue[C]) Finish(id uint32, errno int) {
	r := q.reqs[id]
	q.putPermit(int(id))
	r.Done(r, errno)
	q.RetryWaiting()
}

func (q *RequestQueue[C]) putPermit(id int) {
	var zero C
	q.reqs[id], q.via[id] = nil, zero
	q.set.permits.Put(id)
	if q.set.starving.Load() > 0 {
		q.set.kickStarved(&q.st)
	}
}

// FailOver moves the requests carried by c, a connection of path skip
// that failed, to another usable path (skip only if it is the only one),
// with their permits; those that find none wait. st are path skip's
// statistics: they leave its in-flight count and count as failovers.
func (q *RequestQueue[C]) FailOver(c C, skip int, st *rtrs.ClientPathStats) {
	var zero C
	for id, v := range q.via {
		r := q.reqs[id]
		if v != c || r == nil {
			continue
		}
		st.DecInflight()
		st.RecordFailover(q.id)
		q.via[id] = zero
		q.failovers[id]++
		w := waiter{r: r, permit: int32(id), start: q.start[id]}
		if !q.send(&w, skip) {
			q.waiting.push(w)
		}
	}
}

// RetryWaiting sends the waiting requests that can go now, in order. When
// the queue is closed or no path has hope left, those still waiting fail
// with -ENOTCONN. The transport calls it after each batch of control
// messages (a path came up, a permit was returned on another queue, ...).
func (q *RequestQueue[C]) RetryWaiting() {
	q.st.kicked.Store(false)
	for q.waiting.len() > 0 {
		w := q.waiting.pop()
		if !q.send(&w, -1) {
			q.waiting.pushFront(w)
			break
		}
	}
	if q.waiting.len() > 0 && (q.closed || !q.carrier.Hope()) {
		for q.waiting.len() > 0 {
			w := q.waiting.pop()
			if w.permit >= 0 {
				q.putPermit(int(w.permit))
			}
			w.r.Done(w.r, -int(syscall.ENOTCONN))
		}
	}
	if q.waiting.len() == 0 && q.st.starved.Swap(false) {
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
// permit, and whether the queue starves for permits. It walks the permits:
// not for the data path.
func (q *RequestQueue[C]) Counts() (waiting, inflight int, starved bool) {
	for _, r := range q.reqs {
		if r != nil {
			inflight++
		}
	}
	return q.waiting.len(), inflight, q.st.starved.Load()
}
