package rtrs

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeConn is a connection of a fake transport.
type fakeConn struct {
	path  int
	up    bool
	sent  []*Request
	stats *ClientPathStats
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

func (f *fakeCarrier) Send(r *Request, c *fakeConn) error {
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
		f.conns = append(f.conns, &fakeConn{path: i, up: true, stats: NewClientPathStats(2)})
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
	q := NewRequestQueue(NewQueueSet(NewPermits(4)), 0, f)
	d := &doneLog{errnos: map[*Request]int{}}
	r := newReqs(1, d)[0]
	q.Submit(r)
	if len(f.conns[0].sent) != 1 || r.Permit() < 0 {
		t.Fatalf("after Submit: sent %d, permit %d", len(f.conns[0].sent), r.Permit())
	}
	got, via := q.InFlight(uint32(r.Permit()))
	if got != r || via != f.conns[0] {
		t.Fatalf("InFlight(%d) = %p, %p; want the request on conn 0", r.Permit(), got, via)
	}
	if got, _ := q.InFlight(1000); got != nil {
		t.Error("InFlight of an id beyond the depth returned a request")
	}
	id := r.Permit()
	q.Complete(r, -5, f.conns[0].stats)
	if e, ok := d.errnos[r]; !ok || e != -5 {
		t.Fatalf("Done: called %v errno %d, want -5", ok, e)
	}
	if r.Permit() != -1 || q.set.permits.InUse() != 0 {
		t.Errorf("after Complete: permit %d, %d permits in use", r.Permit(), q.set.permits.InUse())
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
	set := NewQueueSet(NewPermits(2))
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
	qa.Complete(rs[0], 0, fa.conns[0].stats)
	// Queue a's own waiting request takes the permit back at once ...
	if rs[3].Permit() < 0 {
		t.Error("queue a's waiting request did not get the returned permit")
	}
	// ... and queue b, starving, was woken to retry.
	if fb.wakes != 1 {
		t.Fatalf("queue b woken %d times, want 1", fb.wakes)
	}
	qa.Complete(rs[1], 0, fa.conns[0].stats)
	if fb.wakes != 1 {
		t.Errorf("queue b woken %d times before it retried, want 1", fb.wakes)
	}
	qb.RetryWaiting()
	if rs[2].Permit() < 0 || len(fb.conns[0].sent) != 1 {
		t.Fatalf("queue b's request not sent after the retry: permit %d", rs[2].Permit())
	}
	if _, _, starved := qb.Counts(); starved || set.starving.Load() != 0 {
		t.Errorf("queue b still starving (%v, set count %d)", starved, set.starving.Load())
	}
}

// The admin queue's permit: IO queues leave the last one to it, so that a
// session whose IO holds every other permit (waiting for its devices to be
// reopened) can still send the admin requests that reopen them.
func TestRequestQueueAdminReserve(t *testing.T) {
	set := NewQueueSet(NewPermits(3))
	fio, fadm := newFakeCarrier(1), newFakeCarrier(1)
	io := NewRequestQueue(set, 0, fio)
	adm := NewRequestQueue(set, 1, fadm)
	adm.SetAdmin()
	d := &doneLog{errnos: map[*Request]int{}}
	rs := newReqs(4, d)
	for _, r := range rs[:3] {
		io.Submit(r)
	}
	if len(fio.conns[0].sent) != 2 || rs[2].Permit() >= 0 {
		t.Fatalf("IO took %d permits (third %d), want 2: the last is the admin queue's", len(fio.conns[0].sent), rs[2].Permit())
	}
	adm.Submit(rs[3])
	if rs[3].Permit() < 0 || len(fadm.conns[0].sent) != 1 {
		t.Fatal("the admin request did not get the reserved permit")
	}
	// Without an admin queue nothing is kept back.
	set2 := NewQueueSet(NewPermits(2))
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
	q := NewRequestQueue(NewQueueSet(NewPermits(8)), 0, f)
	d := &doneLog{errnos: map[*Request]int{}}
	rs := newReqs(3, d)
	for _, r := range rs {
		q.Submit(r)
	}
	if len(f.conns[0].sent) != 3 {
		t.Fatalf("%d requests on path 0, want 3", len(f.conns[0].sent))
	}
	ids := []int{rs[0].Permit(), rs[1].Permit(), rs[2].Permit()}
	f.conns[0].up = false
	q.FailOver(f.conns[0], 0, f.conns[0].stats)
	for i, r := range rs {
		if _, via := q.InFlight(uint32(r.Permit())); via != f.conns[1] {
			t.Errorf("request %d not on path 1 after failover", i)
		}
		if r.Permit() != ids[i] {
			t.Errorf("request %d changed permit %d → %d; a failover keeps its chunk", i, ids[i], r.Permit())
		}
		if r.Failovers() != 1 {
			t.Errorf("request %d: %d failovers, want 1", i, r.Failovers())
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
	q := NewRequestQueue(NewQueueSet(NewPermits(2)), 0, f)
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
	q := NewRequestQueue(NewQueueSet(NewPermits(2)), 0, f)
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
	q := NewRequestQueue(NewQueueSet(NewPermits(4)), 0, f)
	done := func(*Request, int) {}
	r := &Request{Data: make([]byte, 4096), Done: done}
	allocs := testing.AllocsPerRun(1000, func() {
		f.conns[0].sent = f.conns[0].sent[:0]
		q.Submit(r)
		q.Complete(r, 0, f.conns[0].stats)
	})
	if allocs != 0 {
		t.Errorf("Submit+Complete: %v allocations, want 0", allocs)
	}
}

func TestReqList(t *testing.T) {
	var l ReqList
	if !l.Empty() || l.Pop() != nil || l.Front() != nil {
		t.Fatal("zero list not empty")
	}
	a, b, c := &Request{Tag: 1}, &Request{Tag: 2}, &Request{Tag: 3}
	l.Push(b)
	l.Push(c)
	l.PushFront(a)
	var tags []uint64
	for r := l.Front(); r != nil; r = l.After(r) {
		tags = append(tags, r.Tag)
	}
	if len(tags) != 3 || tags[0] != 1 || tags[1] != 2 || tags[2] != 3 {
		t.Fatalf("walk: %v, want [1 2 3]", tags)
	}
	for _, want := range []*Request{a, b, c} {
		if got := l.Pop(); got != want {
			t.Fatalf("Pop = tag %d, want %d", got.Tag, want.Tag)
		}
	}
	if !l.Empty() {
		t.Error("list not empty after popping all")
	}
	l.Push(a)
	l.Clear()
	if !l.Empty() {
		t.Error("list not empty after Clear")
	}
	l.Push(b) // re-pushing after Clear must not drag a's old links in
	if l.Pop() != b || !l.Empty() {
		t.Error("push after Clear: wrong contents")
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

func TestPathState(t *testing.T) {
	for s, want := range map[int32]string{PathStateConnecting: "connecting", PathStateConnected: "connected",
		PathStateReconnecting: "reconnecting", PathStateDisconnected: "disconnected", PathStateRemoved: "removed", 42: "unknown"} {
		if got := PathStateName(s); got != want {
			t.Errorf("PathStateName(%d) = %q, want %q", s, got, want)
		}
	}
	for s, want := range map[int32]bool{PathStateConnecting: true, PathStateConnected: true,
		PathStateReconnecting: true, PathStateDisconnected: false, PathStateRemoved: false} {
		if PathHasHope(s) != want {
			t.Errorf("PathHasHope(%s) = %v", PathStateName(s), !want)
		}
	}
	if s := (PathAddr{Src: "10.0.0.1", Dst: "10.0.0.2:1234"}).String(); s != "10.0.0.1@10.0.0.2:1234" {
		t.Errorf("PathAddr.String = %q", s)
	}
	if s := (PathAddr{Dst: "h:1"}).String(); s != "h:1" {
		t.Errorf("PathAddr.String without Src = %q", s)
	}
}

func TestConnRspParams(t *testing.T) {
	p, err := (&ConnRsp{QueueDepth: 512, MaxIOSize: 126976, MaxHdrSize: 4096}).Params()
	mustNoErr(t, err)
	if p.ChunkSize != 131072 || p.QueueDepth != 512 || p.MaxIOSize != 126976 {
		t.Errorf("params %+v", p)
	}
	if _, err := p.Codec.IOReq(511, 100); err != nil {
		t.Errorf("codec of the params refuses buf id 511: %v", err)
	}
	mustNoErr(t, p.CheckRequest(&Request{Data: make([]byte, p.MaxIOSize), Usr: make([]byte, p.MaxHdrSize-RdmaReadHdrSize-SGDescSize)}))
	for _, r := range []*Request{{Data: make([]byte, p.MaxIOSize+1)}, {Usr: make([]byte, p.MaxHdrSize-RdmaReadHdrSize-SGDescSize+1)}} {
		if err := p.CheckRequest(r); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("CheckRequest of %d data, %d user bytes: %v, want EINVAL", len(r.Data), len(r.Usr), err)
		}
	}
	_, err = (&ConnRsp{QueueDepth: 512, MaxIOSize: 126976}).Params()
	wantErr(t, err, ErrOutOfRange)
	_, err = (&ConnRsp{QueueDepth: 1, MaxIOSize: 1 << 28, MaxHdrSize: 4096}).Params()
	wantErr(t, err, ErrOutOfRange)
}

func TestCheckClientSession(t *testing.T) {
	mustNoErr(t, CheckClientSession("s", 1, 2, -1))
	for _, tc := range []struct {
		paths, cids, recon int
	}{{0, 2, 0}, {MaxPathsNum + 1, 2, 0}, {1, 1, 0}, {1, MaxConnsPerPath + 1, 0}, {1, 2, -2}, {1, 2, 10000}} {
		if err := CheckClientSession("s", tc.paths, tc.cids, tc.recon); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%+v: %v, want EINVAL", tc, err)
		}
	}
	if err := CheckClientSession("", 1, 2, 0); err == nil {
		t.Error("empty session name accepted")
	}
	d, err := ClientConfig{SessName: "s", Paths: make([]PathAddr, 1), Queues: 3, AdminQueue: true, Timeout: time.Second}.Checked()
	mustNoErr(t, err)
	if d.Timeout != time.Second || d.ReconnectDelay != ReconnectBackoff || d.HeartbeatInterval != HBInterval || d.MissedHeartbeats != HBMissedMax {
		t.Errorf("defaults %+v", d)
	}
	if d.NumQueues() != 4 || d.CIDNum() != 5 {
		t.Errorf("3 queues and the admin queue: %d queues, %d cids; want 4, 5", d.NumQueues(), d.CIDNum())
	}
	for _, bad := range []ClientConfig{
		{SessName: "s", Paths: make([]PathAddr, 1), Queues: -1},
		{SessName: "s", Paths: make([]PathAddr, 1), Timeout: -time.Second},
		{SessName: "s", Paths: make([]PathAddr, 1), Queues: MaxConnsPerPath},
	} {
		if _, err := bad.Checked(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%+v: %v, want EINVAL", bad, err)
		}
	}
}

func TestReconnectLimit(t *testing.T) {
	var l ReconnectLimit
	if !l.Reached(0) {
		t.Error("zero limit: no reconnect allowed, but Reached(0) is false")
	}
	mustNoErr(t, l.Set(3))
	if l.Get() != 3 || l.Reached(2) || !l.Reached(3) {
		t.Errorf("limit 3: Get %d, Reached(2) %v, Reached(3) %v", l.Get(), l.Reached(2), l.Reached(3))
	}
	mustNoErr(t, l.Set(-1))
	if l.Reached(1 << 30) {
		t.Error("limit -1 reached")
	}
	if err := l.Set(-2); !errors.Is(err, syscall.EINVAL) || l.Get() != -1 {
		t.Errorf("Set(-2): %v, limit now %d; want EINVAL and -1 kept", err, l.Get())
	}
}

// Replace takes the stale messages out, in order, hands them to drop, and
// wakes the receiver; after Close the new message itself is dropped.
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
	if n, err := unix.Poll(fds, 1000); err != nil || n != 1 {
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
