package tcp

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/procs"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/session"
	"github.com/urnbd/urnbd/uring"
)

// ClientQueue is one per-CPU queue of a client session: the requests
// submitted on one thread go out on that queue's IO connection of the path
// the policy picks, and their completions come back on the same thread,
// through the same io_uring. All its methods but Run must be called on the
// queue's thread (from Run's start function or a Done callback).
type ClientQueue struct {
	c      *Client
	id     int
	ring   *uring.Ring
	udBase uint64
	policy rtrs.MPPolicy
	rr     int
	unheld bool // the admin queue: sends while the session's IO is held

	slots   []*qconn // by path index; nil where the path has no connection here
	reqs    *rtrs.RequestQueue[*qconn]
	frames  []sendFrame // by permit id: the frame of the request holding it
	scratch []byte      // per permit id: frame header, user message, RTRS header
	dirty   []*qconn    // connections with frames to write at Flush
	// unfenced are dead connections whose requests wait for the server
	// to fence their path (the session layer's fence) before they go again.
	unfenced rtrs.Unfenced[*qconn]
	onCQE    func(*uring.CQE)
	onMsg    func(qmsg)
	mbox     *rtrs.Mailbox[qmsg]
	// state is queueIdle until a loop first drives the queue, then
	// queueDriven or queueDetached (Attach, Detach), and queueClosed once
	// the closed client's sockets and mailbox are closed.
	state atomic.Int32
}

const (
	queueIdle int32 = iota
	queueDriven
	queueDetached
	queueClosed
)

type qmsgKind int

const (
	msgAttach qmsgKind = iota
	msgDetach
	msgRetry
	msgPolicy
	msgClose
	msgDo
	msgFenced // the server closed path's connects up to gen
)

// qmsg is a control message from a path goroutine to a queue.
type qmsg struct {
	kind   qmsgKind
	path   *session.Path
	fd     int
	gen    uint64 // msgAttach: the path's connect the connection belongs to; msgFenced: the newest connect fenced
	policy rtrs.MPPolicy
	do     func()
}

// qconn is a queue's IO connection on one path.
type qconn struct {
	q      *ClientQueue
	path   *session.Path
	gen    uint64 // the path's connect it belongs to
	slot   int
	fd     int
	dec    *Decoder
	rbuf   []byte
	sendq  rtrs.ReqList
	iov    [64]unix.Iovec
	dirty  bool // queued in q.dirty, to be flushed
	recvOn bool // a RECV is in the ring
	direct bool // that RECV reads into the payload of a frame, not rbuf
	large  bool // the last frame had a large payload: see armRecv
	// failOver: the connection failed while a direct RECV was in the ring;
	// its requests fail over when that RECV ends, not before, or the
	// kernel could still copy stale data into a buffer already reused.
	failOver bool
	// unfenced: the connection failed and the server may still have its
	// requests unread; they fail over once the path is fenced.
	unfenced bool
	pollOn   bool // a POLLOUT is in the ring
	dead     bool
}

// User data of the queue's ring entries: kind in bits 56..59, slot below.
const (
	udRecv    = 1 << 56
	udPollOut = 2 << 56
	udWake    = 3 << 56
	udKind    = 0xf << 56
)

func newClientQueue(c *Client, id int, policy rtrs.MPPolicy) (*ClientQueue, error) {
	mbox, err := rtrs.NewMailbox[qmsg]()
	if err != nil {
		return nil, fmt.Errorf("rtrs/tcp client queue %d: %w", id, err)
	}
	qd := c.params.QueueDepth
	stride := HeaderSize + c.params.MaxHdrSize
	q := &ClientQueue{
		c: c, id: id, policy: policy, mbox: mbox,
		frames: make([]sendFrame, qd), scratch: make([]byte, qd*stride),
	}
	q.reqs = rtrs.NewRequestQueue(c.queueSet, id, carrier{q})
	q.onCQE = q.HandleCQE
	q.onMsg = q.handleMsg
	return q, nil
}

// carrier is the queue's transport half of its rtrs.RequestQueue.
type carrier struct{ q *ClientQueue }

func (k carrier) Pick(skip int) (*qconn, bool) {
	q := k.q
	if !q.unheld && q.c.s.Link().Held() {
		return nil, false // ResumeIO wakes the queue
	}
	i := rtrs.Select(q.policy, q.slots, &q.rr, skip)
	if i < 0 {
		return nil, false
	}
	return q.slots[i], true
}

func (k carrier) Send(r *Request, qc *qconn) error {
	q := k.q
	if err := q.buildFrame(r); err != nil {
		return err
	}
	qc.path.Stats().IncInflight()
	qc.sendq.Push(r)
	if !qc.dirty && !qc.pollOn {
		qc.dirty = true
		q.dirty = append(q.dirty, qc)
	}
	return nil
}

func (k carrier) Wake()      { k.q.mbox.Post(qmsg{kind: msgRetry}) }
func (k carrier) Hope() bool { return k.q.c.s.AnyHope() }

// ID returns the queue's index.
func (q *ClientQueue) ID() int { return q.id }

// Run runs the queue's event loop on the calling goroutine, locked to its
// OS thread (pin the thread to a CPU before, if wanted), with its own
// io_uring. start is called once on the thread before the loop; Run
// returns when the client is closed.
func (q *ClientQueue) Run(start func()) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer procs.AddBlockingThread()() // the loop sleeps in io_uring_enter holding a P
	ring, err := uring.New(256, uring.SetupSingleIssuer|uring.SetupDeferTaskrun|uring.SetupCoopTaskrun)
	if err != nil {
		ring, err = uring.New(256, 0)
	}
	if err != nil {
		return fmt.Errorf("rtrs/tcp client queue %d: %w", q.id, err)
	}
	defer ring.Close()
	q.Attach(ring, 0)
	if q.state.Load() == queueClosed {
		return nil // the client was closed before the queue ran
	}
	defer q.Detach()
	if start != nil {
		start()
	}
	var y procs.Yielder
	for !q.reqs.Closed() || q.failingOver() {
		y.Tick()
		q.Flush()
		if _, err := ring.SubmitAndWait(1); err != nil {
			return fmt.Errorf("rtrs/tcp client queue %d: %w", q.id, err)
		}
		ring.ForEachCQE(q.onCQE)
	}
	return nil
}

// Attach makes the queue use ring, an io_uring owned by the calling
// thread's event loop: the queue submits entries with user data
// base|(kind<<56)|slot and the loop hands their completions to HandleCQE.
// base must leave bits 56..59 and the low 32 bits clear.
//
// A queue may be attached again, to another ring, once the ring it was
// attached to is gone (the entries in it died with it): its connections'
// reads are armed in the new ring.
func (q *ClientQueue) Attach(ring *uring.Ring, base uint64) {
	if !q.state.CompareAndSwap(queueIdle, queueDriven) && !q.state.CompareAndSwap(queueDetached, queueDriven) {
		return // closed: the client is gone
	}
	q.ring, q.udBase = ring, base
	q.armWake()
	for _, qc := range q.slots {
		if qc == nil {
			continue
		}
		qc.recvOn, qc.pollOn, qc.direct = false, false, false
		q.endFailOver(qc)
		if qc.dead {
			q.reap(qc)
			continue
		}
		q.armRecv(qc)
		if !qc.sendq.Empty() && !qc.dirty {
			qc.dirty = true
			q.dirty = append(q.dirty, qc)
		}
	}
}

// Detach tells the queue that the event loop driving it stops: its ring
// is closed next, and the queue's entries in it die. The connections stay
// for a later Attach; once the client is closed, Detach (or Close, for a
// queue already detached or never driven) closes them and the mailbox.
// Call it on the queue's thread, as the last thing the loop does with the
// queue.
func (q *ClientQueue) Detach() {
	q.ring = nil
	q.state.Store(queueDetached)
	if q.reqs.Closed() {
		q.closeUndriven()
	}
}

// closeUndriven closes the sockets and the mailbox of a closed client's
// queue that no loop drives (any more), once: by Detach on the queue's
// thread, or by Client.Close for a queue detached or never driven.
func (q *ClientQueue) closeUndriven() {
	if !q.state.CompareAndSwap(queueDetached, queueClosed) && !q.state.CompareAndSwap(queueIdle, queueClosed) {
		return
	}
	// Connections handed over but never taken.
	q.mbox.Drain(func(m qmsg) {
		if m.kind == msgAttach {
			unix.Close(m.fd)
		}
	})
	q.mbox.Close()
	for _, qc := range q.slots {
		if qc != nil && qc.fd >= 0 {
			unix.Close(qc.fd)
			qc.fd = -1
		}
	}
}

func (q *ClientQueue) sqe() *uring.SQE {
	for {
		if s := q.ring.GetSQE(); s != nil {
			return s
		}
		if _, err := q.ring.Submit(); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) {
			panic(fmt.Sprintf("rtrs/tcp client queue %d: submit: %v", q.id, err))
		}
	}
}

func (q *ClientQueue) armWake() {
	q.sqe().PrepPollAdd(int32(q.mbox.Fd()), unix.POLLIN, false, q.udBase|udWake)
}

func (q *ClientQueue) post(m qmsg) { q.mbox.Post(m) }

// Do runs fn on the queue's thread, soon. It may be called from any
// goroutine; it is for control work, not for each request.
func (q *ClientQueue) Do(fn func()) { q.post(qmsg{kind: msgDo, do: fn}) }

// HandleCQE handles a completion of one of the queue's entries.
func (q *ClientQueue) HandleCQE(cqe *uring.CQE) {
	ud := cqe.UserData
	switch ud & udKind {
	case udWake:
		q.mbox.Drain(q.onMsg)
		q.reqs.RetryWaiting()
		if !q.reqs.Closed() {
			q.armWake()
		}
	case udRecv:
		q.onRecv(q.slotConn(ud), cqe.Res)
	case udPollOut:
		qc := q.slotConn(ud)
		if qc == nil {
			return
		}
		qc.pollOn = false
		if qc.dead {
			q.reap(qc)
			return
		}
		q.flush(qc)
	}
}

func (q *ClientQueue) slotConn(ud uint64) *qconn {
	slot := int(uint32(ud))
	if slot < len(q.slots) {
		return q.slots[slot]
	}
	return nil
}

// handleMsg handles a control message on the queue's thread.
func (q *ClientQueue) handleMsg(m qmsg) {
	switch m.kind {
	case msgAttach:
		q.attachConn(m.path, m.fd, m.gen)
	case msgDetach:
		if i := m.path.Index(); i < len(q.slots) {
			if qc := q.slots[i]; qc != nil && qc.path == m.path {
				q.fail(qc)
			}
		}
	case msgPolicy:
		q.policy = m.policy
	case msgDo:
		m.do()
	case msgClose:
		q.reqs.Close()
		for _, qc := range q.slots {
			if qc != nil {
				q.fail(qc)
			}
		}
		q.releaseUnfenced(func(*qconn) bool { return true })
	case msgFenced:
		q.releaseUnfenced(func(qc *qconn) bool { return qc.path == m.path && qc.gen <= m.gen })
	}
	if q.unfenced.Len() > 0 && !q.c.s.AnyHope() {
		// No path will carry them again: they fail over to nothing and
		// end with -ENOTCONN.
		q.releaseUnfenced(func(*qconn) bool { return true })
	}
}

// releaseUnfenced lets the requests of the unfenced connections that match
// go again.
func (q *ClientQueue) releaseUnfenced(match func(*qconn) bool) {
	q.unfenced.Release(match, func(qc *qconn) {
		qc.unfenced = false
		if !qc.failOver {
			q.reqs.FailOver(qc, qc.slot, qc.path.Stats())
		}
	})
}

func (q *ClientQueue) attachConn(p *session.Path, fd int, gen uint64) {
	idx := p.Index()
	for len(q.slots) <= idx {
		q.slots = append(q.slots, nil)
	}
	if old := q.slots[idx]; old != nil {
		q.fail(old)
	}
	qc := &qconn{q: q, path: p, gen: gen, slot: idx, fd: fd, dec: NewDecoder(ToClient), rbuf: make([]byte, 256<<10)}
	qc.dec.SetSession(q.c.params.Codec, qc)
	q.slots[idx] = qc
	q.armRecv(qc)
}

func (q *ClientQueue) armRecv(qc *qconn) {
	qc.recvOn = true
	buf := qc.rbuf
	qc.direct = false
	tail := qc.dec.PayloadTail()
	if len(tail) >= directRecvMin {
		buf, qc.direct = tail, true
	} else if len(tail) == 0 && qc.large {
		// Large answers come in a row: read little beyond the next
		// header, and the rest of its payload straight into place.
		buf = qc.rbuf[:directRecvMin/4]
	}
	s := q.sqe()
	s.PrepRead(int32(qc.fd), unsafe.Pointer(&buf[0]), uint32(len(buf)), ^uint64(0), q.udBase|udRecv|uint64(qc.slot))
}

// directRecvMin is the least payload still to come that is read straight
// into its buffer rather than into rbuf and copied: large read answers
// then cross memory once instead of twice. Smaller rests are not worth
// the extra RECV.
const directRecvMin = 16 << 10

// Usable implements rtrs.PathLoad for the policy: the path is up and this
// queue has its connection.
func (qc *qconn) Usable() bool    { return qc != nil && !qc.dead && qc.path.Usable() }
func (qc *qconn) Inflight() int64 { return qc.path.Inflight() }
func (qc *qconn) Latency() int64  { return qc.path.Latency() }

// Submit sends r. It never blocks: without a free permit or a usable path
// the request waits in the queue, and is sent when a permit is returned or
// a path comes up. It returns an error only for a request that can never
// be sent (too large); then Done is not called.
func (q *ClientQueue) Submit(r *Request) error {
	if err := q.c.params.CheckRequest(r); err != nil {
		return fmt.Errorf("rtrs/tcp: %w", err)
	}
	q.reqs.Submit(r)
	return nil
}

// buildFrame lays out r's frame in its scratch slot: header, then for a
// write the data and the user message + RdmaWriteMsg, for a read the user
// message + RdmaReadMsg with one descriptor naming the reply's length.
func (q *ClientQueue) buildFrame(r *Request) error {
	p := q.c.params
	stride := HeaderSize + p.MaxHdrSize
	id := r.Permit()
	buf := q.scratch[id*stride : (id+1)*stride]
	f := &q.frames[id]
	tail := buf[HeaderSize:]
	n := copy(tail, r.Usr)
	var l rtrs.IOLayout
	var err error
	if r.Write {
		if l, err = rtrs.WriteLayout(len(r.Data), len(r.Usr), uint32(p.ChunkSize), uint32(p.MaxHdrSize)); err != nil {
			return err
		}
		m := rtrs.RdmaWriteMsg{UsrLen: uint16(len(r.Usr))}
		k, err := m.MarshalTo(tail[n:])
		if err != nil {
			return err
		}
		n += k
		f.parts[0], f.parts[1], f.parts[2] = buf[:HeaderSize], r.Data, tail[:n]
	} else {
		sg := 0
		if len(r.Data) > 0 {
			sg = 1
		}
		if l, err = rtrs.ReadLayout(len(r.Data), len(r.Usr), sg, uint32(p.ChunkSize), uint32(p.MaxHdrSize)); err != nil {
			return err
		}
		var desc [1]rtrs.SGDesc
		desc[0].Len = uint32(len(r.Data))
		m := rtrs.RdmaReadMsg{UsrLen: uint16(len(r.Usr)), Desc: desc[:sg]}
		k, err := m.MarshalTo(tail[n:])
		if err != nil {
			return err
		}
		n += k
		f.parts[0], f.parts[1], f.parts[2] = buf[:HeaderSize+n], nil, nil
	}
	h, err := IOReqHeader(p.Codec, uint32(id), l)
	if err != nil {
		return err
	}
	h.MarshalTo(buf[:HeaderSize])
	f.len, f.sent = HeaderSize+int(l.WriteLen), 0
	return nil
}

// Flush writes the frames queued since the last Flush, many per system
// call. The event loop that drives the queue calls it after each batch of
// completions (Run does).
func (q *ClientQueue) Flush() {
	// A failed write fails requests over, which may queue more
	// connections here: take them from the end until none is left.
	for n := len(q.dirty); n > 0; n = len(q.dirty) {
		qc := q.dirty[n-1]
		q.dirty[n-1] = nil
		q.dirty = q.dirty[:n-1]
		qc.dirty = false
		if !qc.dead && !qc.pollOn {
			q.flush(qc)
		}
	}
}

// flush writes queued frames until the socket is full (then a POLLOUT is
// armed) or the queue is empty.
func (q *ClientQueue) flush(qc *qconn) {
	for !qc.sendq.Empty() {
		n := 0
		for r := qc.sendq.Front(); r != nil && n+3 <= len(qc.iov); r = qc.sendq.After(r) {
			n += q.frames[r.Permit()].iovecs((*[3]unix.Iovec)(qc.iov[n : n+3]))
		}
		w, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(qc.fd), uintptr(unsafe.Pointer(&qc.iov[0])), uintptr(n))
		switch {
		case errno == unix.EAGAIN:
			qc.pollOn = true
			q.sqe().PrepPollAdd(int32(qc.fd), unix.POLLOUT, false, q.udBase|udPollOut|uint64(qc.slot))
			return
		case errno == unix.EINTR:
			continue
		case errno != 0:
			q.fail(qc)
			return
		}
		for left := int(w); left > 0; {
			f := &q.frames[qc.sendq.Front().Permit()]
			k := min(left, f.len-f.sent)
			f.sent += k
			left -= k
			if f.sent == f.len {
				qc.sendq.Pop()
			}
		}
	}
}

func (q *ClientQueue) onRecv(qc *qconn, res int32) {
	if qc == nil {
		return
	}
	direct := qc.direct
	qc.recvOn, qc.direct = false, false
	if qc.dead {
		q.endFailOver(qc)
		q.reap(qc)
		return
	}
	if res <= 0 {
		if res == -int32(unix.EINTR) || res == -int32(unix.EAGAIN) {
			q.armRecv(qc)
			return
		}
		q.fail(qc)
		return
	}
	frames := 0
	defer func() { qc.path.Stats().RecordPoll(q.id, frames) }()
	if direct {
		f, err := qc.dec.Filled(int(res))
		if err != nil {
			q.fail(qc)
			return
		}
		if f != nil {
			frames++
			qc.large = true
			if !q.onFrame(qc, f) {
				return
			}
		}
		q.armRecv(qc)
		return
	}
	b := qc.rbuf[:res]
	for len(b) > 0 {
		n, f, err := qc.dec.Feed(b)
		b = b[n:]
		if err != nil {
			q.fail(qc)
			return
		}
		if f == nil {
			break
		}
		frames++
		qc.large = len(f.Payload) >= directRecvMin
		if !q.onFrame(qc, f) {
			return
		}
	}
	q.armRecv(qc)
}

// onFrame completes the request that frame f answers. It returns false if
// the frame was bad and failed the connection.
func (q *ClientQueue) onFrame(qc *qconn, f *Frame) bool {
	if f.Imm.Type != rtrs.ImmIORsp {
		return true // heartbeats are the service connection's business
	}
	r, via := q.reqs.InFlight(f.Imm.BufID)
	if r == nil || via != qc {
		q.fail(qc) // an answer to nothing we sent here
		return false
	}
	errno := f.Imm.Errno
	if errno == 0 && !r.Write && int(f.Len) != len(r.Data) {
		errno = -int(syscall.EIO)
	}
	q.reqs.Complete(r, errno, qc.path.Stats())
	return true
}

// Place implements Placer: a read's data goes straight into its buffer.
func (qc *qconn) Place(f *Frame) ([]byte, error) {
	r, via := qc.q.reqs.InFlight(f.Imm.BufID)
	if r == nil || r.Write || via != qc || int(f.Len) > len(r.Data) {
		return nil, fmt.Errorf("rtrs/tcp: %d bytes of read data for request %d: %w", f.Len, f.Imm.BufID, rtrs.ErrOutOfRange)
	}
	return r.Data[:f.Len], nil
}

// fail takes a connection out of service: its requests fail over to
// another path (or wait for one), the path is reported failed, and the
// socket is shut down so the ring's entries on it end.
func (q *ClientQueue) fail(qc *qconn) {
	if qc.dead {
		return
	}
	qc.dead = true
	unix.Shutdown(qc.fd, unix.SHUT_RDWR)
	// Dropped when the path took its connections back itself (detach).
	qc.path.Failed(qc.gen, "queue %d: IO connection failed", q.id)
	qc.sendq.Clear()
	if q.c.s.Fencing() && !q.reqs.Closed() && qc.gen > qc.path.FencedGen() {
		qc.unfenced = true // see qconn.unfenced
		q.unfenced.Hold(qc)
	}
	if qc.recvOn && qc.direct {
		qc.failOver = true // when the RECV ends: see qconn.failOver
	} else if !qc.unfenced {
		q.reqs.FailOver(qc, qc.slot, qc.path.Stats())
	}
	q.reap(qc)
}

// failingOver reports whether a connection waits for its direct RECV to
// end before its requests fail over (and, once closed, fail).
func (q *ClientQueue) failingOver() bool {
	for _, qc := range q.slots {
		if qc != nil && qc.failOver {
			return true
		}
	}
	return false
}

// endFailOver fails over a dead connection's requests if fail postponed it
// until its direct RECV ended.
func (q *ClientQueue) endFailOver(qc *qconn) {
	if qc.failOver {
		qc.failOver = false
		if !qc.unfenced {
			q.reqs.FailOver(qc, qc.slot, qc.path.Stats())
		}
	}
}

// reap closes a dead connection once the ring no longer refers to it.
func (q *ClientQueue) reap(qc *qconn) {
	if qc.recvOn || qc.pollOn || qc.fd < 0 {
		return
	}
	unix.Close(qc.fd)
	qc.fd = -1
	if qc.slot < len(q.slots) && q.slots[qc.slot] == qc {
		q.slots[qc.slot] = nil
	}
}

var _ rtrs.Queue = (*ClientQueue)(nil)
