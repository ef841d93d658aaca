package clientq

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"golang.org/x/sys/unix"
)

// Request is the caller's request, as in the transports.
type Request = rtrs.Request

// permitOf returns the permit r holds on q, or -1.
func (q *RequestQueue[C]) permitOf(r *Request) int {
	for id, x := range q.reqs {
		if x == r {
			return id
		}
	}
	return -1
}

// fakeConn is a connection of a fake transport.
type fakeConn struct {
	path  int
	up    bool
	sent  []*Request
	stats *rtrs.ClientPathStats
}

// fakeCarrier is a transport with one connection per path.
type fakeCarrier struct {
	conns   []*fakeConn
	hope    bool
	wakes   int
	sendErr error
}

func (f *fakeCarrier) Pick(skip int) (*fakeConn, bool) {
	var fallback *fakeConn
	for _, c := range f.conns {
		if !c.up {
			continue
		}
		if c.path == skip {
			fallback = c
			continue
		}
		return c, true
	}
	return fallback, fallback != nil
}

func (f *fakeCarrier) Send(r *Request, permit int, c *fakeConn) error {
	if f.sendErr != nil {
		return f.sendErr
	}
	c.stats.IncInflight()
	c.sent = append(c.sent, r)
	return nil
}

func (f *fakeCarrier) Wake()      { f.wakes++ }
func (f *fakeCarrier) Hope() bool { return f.hope }

func newFakeCarrier(paths int) *fakeCarrier {
	f := &fakeCarrier{hope: true}
	for i := 0; i < paths; i++ {
		f.conns = append(f.conns, &fakeConn{path: i, up: true, stats: rtrs.NewClientPathStats(2)})
	}
	return f
}

// doneLog records Done calls.
type doneLog struct{ errnos map[*Request]int }

func (d *doneLog) done(r *Request, errno int) { d.errnos[r] = errno }

func newReqs(n int, d *doneLog) []*Request {
	rs := make([]*Request, n)
	for i := range rs {
		rs[i] = &Request{Tag: uint64(i), Usr: make([]byte, 8), Data: make([]byte, 512), Done: d.done}
	}
	return rs
}

func TestRequestQueueSubmitComplete(t *testing.T) {
	f := newFakeCarrier(1)
	q := NewRequestQueue(NewQueueSet(rtrs.NewPermits(4)), 0, f)
	d := &doneLog{errnos: map[*Request]int{}}
	r := newReqs(1, d)[0]
	q.Submit(r)
	id := q.permitOf(r)
	if len(f.conns[0].sent) != 1 || id < 0 {
		t.Fatalf("after Submit: sent %d, permit %d", len(f.conns[0].sent), id)
	}
	got, via := q.InFlight(uint32(id))
	if got != r || via != f.conns[0] {
		t.Fatalf("InFlight(%d) = %p, %p; want the request on conn 0", id, got, via)
	}
	if got, _ := q.InFlight(1000); got != nil {
		t.Error("InFlight of an id beyond the depth returned a request")
	}
	q.Complete(uint32(id), -5, f.conns[0].stats)
	if e, ok := d.errnos[r]; !ok || e != -5 {
		t.Fatalf("Done: called %v errno %d, want -5", ok, e)
	}
	if p := q.permitOf(r); p != -1 || q.set.permits.InUse() != 0 {
		t.Errorf("after Complete: permit %d, %d permits in use", p, q.set.permits.InUse())
	}
	if got, _ := q.InFlight(uint32(id)); got != nil {
		t.Error("request still in flight after Complete")
	}
	if n := f.conns[0].stats.Inflight(); n != 0 {
		t.Errorf("path in flight %d after Complete", n)
	}
	if s := f.conns[0].stats.Snapshot(); s.Read.Count != 1 || s.Write.Count != 0 {
		t.Errorf("stats count %d reads and %d writes, want one read", s.Read.Count, s.Write.Count)
	}
}

func TestRequestQueuePermitStarvation(t *testing.T) {
	set := NewQueueSet(rtrs.NewPermits(2))
	fa, fb := newFakeCarrier(1), newFakeCarrier(1)
	qa := NewRequestQueue(set, 0, fa)
	qb := NewRequestQueue(set, 1, fb)
	d := &doneLog{errnos: map[*Request]int{}}
	rs := newReqs(4, d)
	qa.Submit(rs[0])
	qa.Submit(rs[1])
	qb.Submit(rs[2]) // no permit left: waits, queue b starves
	qa.Submit(rs[3]) // waits too
	if w, in, starved := qb.Counts(); w != 1 || in != 0 || !starved {
		t.Fatalf("queue b: waiting %d in flight %d starved %v; want 1 0 true", w, in, starved)
	}
	qa.Complete(uint32(qa.permitOf(rs[0])), 0, fa.conns[0].stats)
	// Queue a's own waiting request takes the permit back at once ...
	if qa.permitOf(rs[3]) < 0 {
		t.Error("queue a's waiting request did not get the returned permit")
	}
	// ... and queue b, starving, was woken to retry.
	if fb.wakes != 1 {
		t.Fatalf("queue b woken %d times, want 1", fb.wakes)
	}
	qa.Complete(uint32(qa.permitOf(rs[1])), 0, fa.conns[0].stats)
	if fb.wakes != 1 {
		t.Errorf("queue b woken %d times before it retried, want 1", fb.wakes)
	}
	qb.RetryWaiting()
	if p := qb.permitOf(rs[2]); p < 0 || len(fb.conns[0].sent) != 1 {
		t.Fatalf("queue b's request not sent after the retry: permit %d", p)
	}
	if _, _, starved := qb.Counts(); starved || set.starving.Load() != 0 {
		t.Errorf("queue b still starving (%v, set count %d)", starved, set.starving.Load())
	}
}

// The admin queue's permit: IO queues leave the last one to it, so that a
// session whose IO holds every other permit (waiting for its devices to be
// reopened) can still send the admin requests that reopen them.
func TestRequestQueueAdminReserve(t *testing.T) {
	set := NewQueueSet(rtrs.NewPermits(3))
	fio, fadm := newFakeCarrier(1), newFakeCarrier(1)
	io := NewRequestQueue(set, 0, fio)
	adm := NewRequestQueue(set, 1, fadm)
	adm.SetAdmin()
	d := &doneLog{errnos: map[*Request]int{}}
	rs := newReqs(4, d)
	for _, r := range rs[:3] {
		io.Submit(r)
	}
	if p := io.permitOf(rs[2]); len(fio.conns[0].sent) != 2 || p >= 0 {
		t.Fatalf("IO took %d permits (third %d), want 2: the last is the admin queue's", len(fio.conns[0].sent), p)
	}
	adm.Submit(rs[3])
	if adm.permitOf(rs[3]) < 0 || len(fadm.conns[0].sent) != 1 {
		t.Fatal("the admin request did not get the reserved permit")
	}
	// Without an admin queue nothing is kept back.
	set2 := NewQueueSet(rtrs.NewPermits(2))
	f2 := newFakeCarrier(1)
	q2 := NewRequestQueue(set2, 0, f2)
	for _, r := range newReqs(2, d) {
		q2.Submit(r)
	}
	if len(f2.conns[0].sent) != 2 {
		t.Fatalf("a session without an admin queue sent %d of 2", len(f2.conns[0].sent))
	}
}

func TestRequestQueueFailOver(t *testing.T) {
	f := newFakeCarrier(2)
	q := NewRequestQueue(NewQueueSet(rtrs.NewPermits(8)), 0, f)
	d := &doneLog{errnos: map[*Request]int{}}
	rs := newReqs(3, d)
	for _, r := range rs {
		q.Submit(r)
	}
	if len(f.conns[0].sent) != 3 {
		t.Fatalf("%d requests on path 0, want 3", len(f.conns[0].sent))
	}
	ids := []int{q.permitOf(rs[0]), q.permitOf(rs[1]), q.permitOf(rs[2])}
	f.conns[0].up = false
	q.FailOver(f.conns[0], 0, f.conns[0].stats)
	for i, r := range rs {
		id := q.permitOf(r)
		if _, via := q.InFlight(uint32(id)); via != f.conns[1] {
			t.Errorf("request %d not on path 1 after failover", i)
		}
		if id != ids[i] {
			t.Errorf("request %d changed permit %d → %d; a failover keeps its chunk", i, ids[i], id)
		}
		if n := q.failovers[id]; n != 1 {
			t.Errorf("request %d: %d failovers, want 1", i, n)
		}
	}
	if s := f.conns[0].stats.Snapshot(); s.Failovers != 3 || s.Inflight != 0 {
		t.Errorf("path 0: failovers %d in flight %d; want 3 and 0", s.Failovers, s.Inflight)
	}
	if n := f.conns[1].stats.Inflight(); n != 3 {
		t.Errorf("path 1: %d in flight, want 3", n)
	}
	// Path 1 fails too, with no hope left: the requests fail.
	f.conns[1].up, f.hope = false, false
	q.FailOver(f.conns[1], 1, f.conns[1].stats)
	q.RetryWaiting()
	for i, r := range rs {
		if e, ok := d.errnos[r]; !ok || e != -int(syscall.ENOTCONN) {
			t.Errorf("request %d: done %v errno %d, want -ENOTCONN", i, ok, e)
		}
	}
	if q.set.permits.InUse() != 0 {
		t.Errorf("%d permits still in use", q.set.permits.InUse())
	}
}

func TestRequestQueueWaitsForPathThenCloses(t *testing.T) {
	f := newFakeCarrier(1)
	f.conns[0].up = false
	q := NewRequestQueue(NewQueueSet(rtrs.NewPermits(2)), 0, f)
	d := &doneLog{errnos: map[*Request]int{}}
	rs := newReqs(2, d)
	q.Submit(rs[0])
	q.Submit(rs[1])
	q.RetryWaiting()
	if len(d.errnos) != 0 {
		t.Fatalf("requests ended while a path may come back: %v", d.errnos)
	}
	f.conns[0].up = true
	q.RetryWaiting()
	if len(f.conns[0].sent) != 2 || f.conns[0].sent[0] != rs[0] {
		t.Fatalf("after the path came up: %d sent (in order: %v)", len(f.conns[0].sent), len(f.conns[0].sent) > 0 && f.conns[0].sent[0] == rs[0])
	}
	f.conns[0].up = false
	q.FailOver(f.conns[0], 0, f.conns[0].stats)
	q.Close()
	q.RetryWaiting()
	for i, r := range rs {
		if d.errnos[r] != -int(syscall.ENOTCONN) {
			t.Errorf("request %d after Close: errno %d, want -ENOTCONN", i, d.errnos[r])
		}
	}
}

func TestRequestQueueSendError(t *testing.T) {
	f := newFakeCarrier(1)
	f.sendErr = errors.New("cannot encode")
	q := NewRequestQueue(NewQueueSet(rtrs.NewPermits(2)), 0, f)
	d := &doneLog{errnos: map[*Request]int{}}
	r := newReqs(1, d)[0]
	q.Submit(r)
	if d.errnos[r] != -int(syscall.EINVAL) || q.set.permits.InUse() != 0 {
		t.Errorf("errno %d, %d permits in use; want -EINVAL and 0", d.errnos[r], q.set.permits.InUse())
	}
}

func TestRequestQueueAllocatesNothing(t *testing.T) {
	f := newFakeCarrier(1)
	f.conns[0].sent = make([]*Request, 0, 1)
	q := NewRequestQueue(NewQueueSet(rtrs.NewPermits(4)), 0, f)
	done := func(*Request, int) {}
	r := &Request{Data: make([]byte, 4096), Done: done}
	allocs := testing.AllocsPerRun(1000, func() {
		f.conns[0].sent = f.conns[0].sent[:0]
		q.Submit(r)
		q.Complete(uint32(q.permitOf(r)), 0, f.conns[0].stats)
	})
	if allocs != 0 {
		t.Errorf("Submit+Complete: %v allocations, want 0", allocs)
	}
}

func TestMailbox(t *testing.T) {
	b, err := NewMailbox[int]()
	mustNoErr(t, err)
	defer b.Close()
	go func() {
		for i := 0; i < 3; i++ {
			b.Post(i)
		}
	}()
	fds := []unix.PollFd{{Fd: int32(b.Fd()), Events: unix.POLLIN}}
	var got []int
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 4 && time.Now().Before(deadline) { // 0, 1, 2 and the 100 posted while draining
		if _, err := unix.Poll(fds, 100); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatal(err)
		}
		b.Drain(func(m int) {
			got = append(got, m)
			if m == 0 {
				b.Post(100) // posted while draining: kept for the next Drain
			}
		})
	}
	// 0, 1, 2 in order; 100, posted while 0 was handled, once, after 0.
	var posted []int
	late := 0
	for _, m := range got {
		if m == 100 {
			late++
			continue
		}
		posted = append(posted, m)
	}
	if len(posted) != 3 || posted[0] != 0 || posted[1] != 1 || posted[2] != 2 || late != 1 || got[0] != 0 {
		t.Fatalf("drained %v, want 0, 1, 2 in order and 100 once after 0", got)
	}
	mustNoErr(t, b.Close())
	b.Post(7) // after Close: dropped, no panic
}

func TestMailboxReplace(t *testing.T) {
	b, err := NewMailbox[int]()
	mustNoErr(t, err)
	for _, m := range []int{1, 10, 2, 11} {
		b.Post(m)
	}
	var dropped []int
	stale := func(m int) bool { return m >= 10 }
	drop := func(m int) { dropped = append(dropped, m) }
	b.Replace(12, stale, drop)
	if !slices.Equal(dropped, []int{10, 11}) {
		t.Fatalf("dropped %v, want [10 11]", dropped)
	}
	fds := []unix.PollFd{{Fd: int32(b.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 1000)
	for errors.Is(err, unix.EINTR) { // the runtime's preemption signal
		n, err = unix.Poll(fds, 1000)
	}
	if err != nil || n != 1 {
		t.Fatalf("mailbox not readable after Replace: %d, %v", n, err)
	}
	var got []int
	b.Drain(func(m int) { got = append(got, m) })
	if !slices.Equal(got, []int{1, 2, 12}) {
		t.Fatalf("drained %v, want [1 2 12]", got)
	}
	mustNoErr(t, b.Close())
	dropped = nil
	b.Replace(13, stale, drop)
	if !slices.Equal(dropped, []int{13}) {
		t.Fatalf("after Close, dropped %v, want [13]", dropped)
	}
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The waiting list keeps order across growth and wrap-around, and a
// request put back in front comes out first.
func TestFIFO(t *testing.T) {
	var f fifo
	rs := make([]*Request, 40)
	for i := range rs {
		rs[i] = &Request{Tag: uint64(i)}
	}
	next := 0
	for round := 0; round < 3; round++ {
		for i := 0; i < 13; i++ {
			f.push(waiter{r: rs[(next+i)%len(rs)], permit: -1})
		}
		for i := 0; i < 13; i++ {
			w := f.pop()
			if i == 5 {
				f.pushFront(w) // put back: the same one comes next
				w = f.pop()
			}
			if want := rs[(next+i)%len(rs)]; w.r != want {
				t.Fatalf("round %d: pop %d = request %d, want %d", round, i, w.r.Tag, want.Tag)
			}
		}
		next += 13
		if f.len() != 0 {
			t.Fatalf("round %d: %d left", round, f.len())
		}
	}
	for i := 0; i < 33; i++ { // past the first size: grows while wrapped
		f.push(waiter{r: rs[i]})
	}
	for i := 0; i < 33; i++ {
		if w := f.pop(); w.r != rs[i] {
			t.Fatalf("after growing: pop %d = request %d", i, w.r.Tag)
		}
	}
}
