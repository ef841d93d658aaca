package rdmatr

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/procs"
	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/session"
	"github.com/urnbd/urnbd/uring"
)

// Request is one IO request of a client (see rtrs.Request). Its Data must
// lie inside the client's registered Region (Client.Region); the user
// message may live anywhere, it is copied into registered memory.
type Request = rtrs.Request

// ClientQueue is one per-CPU queue of a client session: the requests
// submitted on one thread go out on that queue's IO connection of the path
// the policy picks, and their completions come back on the same thread:
// the queue's io_uring polls the completion channels of its connections
// (one-shot POLL_ADD, re-armed after each wake-up). All its methods but
// Run and Do must be called on the queue's thread (from Run's start
// function or a Done callback).
type ClientQueue struct {
	c      *Client
	id     int
	ring   *uring.Ring
	udBase uint64
	policy rtrs.MPPolicy
	rr     int
	unheld bool // the admin queue: sends while the session's IO is held

	slots []*qconn // by path index
	reqs  *rtrs.RequestQueue[*qconn]
	dirty []*qconn // connections with work requests to post at Flush
	wcs   []rdma.WC
	onCQE func(*uring.CQE)
	onMsg func(qmsg)
	mbox  *rtrs.Mailbox[qmsg]
	// unfenced are dead connections whose requests wait for the server
	// to fence their path (the session layer's fence) before they go again.
	unfenced rtrs.Unfenced[*qconn]

	started atomic.Bool
	exited  chan struct{}
	// driven is set once an event loop drives the queue (Attach, Run):
	// only then can it take and release path connections.
	driven atomic.Bool
}

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

type qmsg struct {
	kind   qmsgKind
	path   *session.Path // msgFenced
	gen    uint64        // msgFenced
	pc     *pathConns
	cn     *conn
	policy rtrs.MPPolicy
	do     func()
}

// qconn is a queue's IO connection on one path.
type qconn struct {
	q      *ClientQueue
	pc     *pathConns
	path   *session.Path
	cn     *conn
	slot   int
	sb     *rdma.SendBatch
	rb     *rdma.RecvBatch
	dirty  bool
	sent   int // requests posted, for signalInterval
	pollOn bool
	// polling is set while onPoll handles the connection's completions:
	// a fail meanwhile (an error completion, a Done callback whose
	// request fails to post) must not reap it, since releasing the set
	// lets the path goroutine free the CQ that onPoll still polls.
	polling bool
	dead    bool
	reaped  bool
}

// User data of the queue's ring entries: kind in bits 56..59, slot below.
const (
	udPoll   = 1 << 56
	udWake   = 3 << 56
	udCancel = 4 << 56
	udKind   = 0xf << 56
)

func newClientQueue(c *Client, id int, policy rtrs.MPPolicy) (*ClientQueue, error) {
	mbox, err := rtrs.NewMailbox[qmsg]()
	if err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr client queue %d: %w", id, err)
	}
	q := &ClientQueue{c: c, id: id, policy: policy, mbox: mbox, exited: make(chan struct{}),
		wcs: make([]rdma.WC, 64)}
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

// Send adds r's work request to qc's batch, posted at Flush or at once
// when the batch is full.
func (k carrier) Send(r *Request, qc *qconn) error {
	q := k.q
	if err := q.addWR(qc, r); err != nil {
		if errors.Is(err, errPartUnregistered) {
			// The set was failing when the part was registered, and is
			// going: r fails over with its other requests.
			q.fail(qc, err.Error())
			return nil
		}
		return err
	}
	qc.path.Stats().IncInflight()
	if !qc.dirty {
		qc.dirty = true
		q.dirty = append(q.dirty, qc)
	}
	if qc.sb.Len() == qc.sb.Cap() {
		q.flush(qc)
	}
	return nil
}

func (k carrier) Wake()      { k.q.mbox.Post(qmsg{kind: msgRetry}) }
func (k carrier) Hope() bool { return k.q.c.s.AnyHope() }

// ID returns the queue's index.
func (q *ClientQueue) ID() int { return q.id }

// Run runs the queue's event loop on the calling goroutine, locked to its
// OS thread, with its own io_uring. start is called once on the thread
// before the loop; Run returns when the client is closed.
func (q *ClientQueue) Run(start func()) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer procs.AddBlockingThread()() // the loop sleeps in io_uring_enter holding a P
	q.started.Store(true)
	defer close(q.exited)
	ring, err := uring.New(256, uring.SetupSingleIssuer|uring.SetupDeferTaskrun|uring.SetupCoopTaskrun)
	if err != nil {
		ring, err = uring.New(256, 0)
	}
	if err != nil {
		return fmt.Errorf("rtrs/rdmatr client queue %d: %w", q.id, err)
	}
	defer ring.Close()
	q.Attach(ring, 0)
	defer q.Detach()
	if start != nil {
		start()
	}
	var y procs.Yielder
	for !q.reqs.Closed() || q.busy() {
		y.Tick()
		q.Flush()
		if _, err := ring.SubmitAndWait(1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("rtrs/rdmatr client queue %d: %w", q.id, err)
		}
		ring.ForEachCQE(q.onCQE)
	}
	return nil
}

// busy reports whether ring entries still refer to connections.
func (q *ClientQueue) busy() bool {
	for _, qc := range q.slots {
		if qc != nil && qc.pollOn {
			return true
		}
	}
	return false
}

// Attach makes the queue use ring, an io_uring owned by the calling
// thread's event loop: the queue submits entries with user data
// base|(kind<<56)|slot and the loop hands their completions to HandleCQE
// and calls Flush after each batch. base must leave bits 56..59
// and the low 32 bits clear.
//
// A queue may be attached again, to another ring, once the ring it was
// attached to is gone (its entries died with it): the completion channels
// of its connections are polled in the new ring.
func (q *ClientQueue) Attach(ring *uring.Ring, base uint64) {
	q.driven.Store(true) // before the mailbox is drained and failed is read: see teardown
	q.ring, q.udBase = ring, base
	q.armWake()
	for _, qc := range q.slots {
		if qc != nil && !qc.dead && qc.pc.failed.Load() {
			// Its path went down while the queue was detached: the
			// path may have let go of it for the queue and freed it
			// (see Detach). Fail it without touching its CQ or QP.
			qc.pollOn = false
			q.fail(qc, "path went down while the queue was detached")
			continue
		}
		if qc == nil || !qc.pollOn {
			continue
		}
		qc.pollOn = false
		if qc.dead {
			q.reap(qc)
			continue
		}
		q.armPoll(qc)
	}
}

// Detach tells the queue that the event loop driving it stops: its ring
// is closed next, and the queue's entries in it die. Until the queue is
// attached again, a path that goes down lets go of the queue's claim on
// its connections itself, instead of waiting (Config.Timeout) for a queue
// that no loop drives and then leaking them; a path already down is let
// go of here. Call it on the queue's thread, as the last thing the loop
// does with the queue.
func (q *ClientQueue) Detach() {
	q.driven.Store(false) // before failed is read: see teardown
	for _, qc := range q.slots {
		if qc != nil && qc.pc.failed.Load() {
			qc.pc.release(q.id)
		}
	}
	q.ring = nil
}

func (q *ClientQueue) sqe() *uring.SQE {
	for {
		if s := q.ring.GetSQE(); s != nil {
			return s
		}
		if _, err := q.ring.Submit(); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) {
			panic(fmt.Sprintf("rtrs/rdmatr client queue %d: submit: %v", q.id, err))
		}
	}
}

func (q *ClientQueue) armWake() {
	q.sqe().PrepPollAdd(int32(q.mbox.Fd()), unix.POLLIN, false, q.udBase|udWake)
}

func (q *ClientQueue) armPoll(qc *qconn) {
	qc.pollOn = true
	q.sqe().PrepPollAdd(int32(qc.cn.cc.Fd()), unix.POLLIN, false, q.udBase|udPoll|uint64(qc.slot))
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
	case udPoll:
		slot := int(uint32(ud))
		if slot < len(q.slots) && q.slots[slot] != nil {
			q.onPoll(q.slots[slot])
		}
	}
}

// handleMsg handles a control message on the queue's thread.
func (q *ClientQueue) handleMsg(m qmsg) {
	switch m.kind {
	case msgAttach:
		q.attachConn(m.pc, m.cn)
	case msgDetach:
		if i := m.pc.p.Index(); i < len(q.slots) {
			if qc := q.slots[i]; qc != nil && qc.pc == m.pc {
				q.fail(qc, "detached")
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
				q.fail(qc, "client closed")
			}
		}
		q.releaseUnfenced(func(*qconn) bool { return true })
	case msgFenced:
		q.releaseUnfenced(func(qc *qconn) bool { return qc.path == m.path && qc.pc.gen <= m.gen })
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
	q.unfenced.Release(match, func(qc *qconn) { q.reqs.FailOver(qc, qc.slot, qc.path.Stats()) })
}

func (q *ClientQueue) attachConn(pc *pathConns, cn *conn) {
	idx := pc.p.Index()
	for len(q.slots) <= idx {
		q.slots = append(q.slots, nil)
	}
	if old := q.slots[idx]; old != nil {
		q.fail(old, "replaced")
		if !old.reaped {
			// Its poll is still in the ring; the new set takes the slot
			// once it is reaped. Rare (reconnect faster than a poll).
			q.post(qmsg{kind: msgAttach, pc: pc, cn: cn})
			return
		}
	}
	if pc.failed.Load() || q.reqs.Closed() {
		pc.release(q.id)
		return
	}
	qc := &qconn{q: q, pc: pc, path: pc.p, cn: cn, slot: idx,
		sb: rdma.NewSendBatch(64, 2), rb: rdma.NewRecvBatch(cn.nrecv, 1)}
	q.slots[idx] = qc
	q.armPoll(qc)
}

// Usable implements rtrs.PathLoad for the policy.
func (qc *qconn) Usable() bool    { return qc != nil && !qc.dead && qc.path.Usable() }
func (qc *qconn) Inflight() int64 { return qc.path.Inflight() }
func (qc *qconn) Latency() int64  { return qc.path.Latency() }

// Submit sends r. It never blocks: without a free permit or a usable path
// the request waits in the queue, and is sent when a permit is returned or
// a path comes up. It returns an error only for a request that can never
// be sent (too large, or Data outside the registered region); then Done
// is not called.
func (q *ClientQueue) Submit(r *Request) error {
	if err := q.c.params.CheckRequest(r); err != nil {
		return fmt.Errorf("rtrs/rdmatr: %w", err)
	}
	if _, _, ok := q.c.regionPart(r.Data); !ok {
		return fmt.Errorf("rtrs/rdmatr: request data is not inside one registered part of the region: %w", syscall.EINVAL)
	}
	q.reqs.Submit(r)
	return nil
}

// errPartUnregistered: a request's data lies in a region part that its
// connection's set did not register (see RegisterPart).
var errPartUnregistered = errors.New("region part not registered")

// addWR builds r's header (user message + RTRS header) in its slot of the
// registered header area and adds its RDMA-WRITE-with-IMM to qc's batch:
// a write gathers [data, header] to the chunk base; a read writes only
// the header, with one descriptor naming its buffer in the region, to
// chunk base + D.
func (q *ClientQueue) addWR(qc *qconn, r *Request) error {
	c, pc := q.c, qc.pc
	p := c.params
	hs := p.MaxHdrSize
	id := r.Permit()
	part, off, _ := c.regionPart(r.Data) // checked by Submit
	var mr *rdma.MR
	if len(r.Data) > 0 {
		// Registered on every set that existed when the part was, and on
		// each made since, unless the set was failing then.
		if mr = pc.partMR[part]; mr == nil {
			return fmt.Errorf("region part %d on path %v: %w", part, pc.p.Addr(), errPartUnregistered)
		}
	}
	buf := c.hdr[id*hs : (id+1)*hs]
	n := copy(buf, r.Usr)
	var l rtrs.IOLayout
	var err error
	if r.Write {
		if l, err = rtrs.WriteLayout(len(r.Data), len(r.Usr), uint32(p.ChunkSize), uint32(hs)); err != nil {
			return err
		}
		m := rtrs.RdmaWriteMsg{UsrLen: uint16(len(r.Usr))}
		k, err := m.MarshalTo(buf[n:])
		if err != nil {
			return err
		}
		n += k
	} else {
		sg := 0
		if len(r.Data) > 0 {
			sg = 1
		}
		if l, err = rtrs.ReadLayout(len(r.Data), len(r.Usr), sg, uint32(p.ChunkSize), uint32(hs)); err != nil {
			return err
		}
		var desc [1]rtrs.SGDesc
		if sg > 0 {
			desc[0] = rtrs.SGDesc{Addr: mr.Addr() + uint64(off), Key: mr.RKey(), Len: uint32(len(r.Data))}
		}
		m := rtrs.RdmaReadMsg{UsrLen: uint16(len(r.Usr)), Desc: desc[:sg]}
		k, err := m.MarshalTo(buf[n:])
		if err != nil {
			return err
		}
		n += k
	}
	imm, err := p.Codec.IOReq(uint32(id), l.HdrOff)
	if err != nil {
		return err
	}
	ch := pc.chunks[id]
	wr := rdma.SendWR{ID: uint64(id), Opcode: rdma.WRWriteWithImm, Imm: imm,
		RemoteAddr: ch.Addr + uint64(l.WriteOff), RKey: ch.RKey}
	if qc.sent%signalInterval(p.QueueDepth) == 0 {
		wr.Flags = rdma.SendSignaled
	}
	qc.sent++
	hdr := pc.hdrMR.SGE(id*hs, n)
	if r.Write && len(r.Data) > 0 {
		return qc.sb.Add(wr, mr.SGE(off, len(r.Data)), hdr)
	}
	return qc.sb.Add(wr, hdr)
}

// Flush posts the work requests queued since the last Flush, one
// ibv_post_send per connection. The event loop that drives the queue
// calls it after each batch of completions (Run does).
func (q *ClientQueue) Flush() {
	for n := len(q.dirty); n > 0; n = len(q.dirty) {
		qc := q.dirty[n-1]
		q.dirty[n-1] = nil
		q.dirty = q.dirty[:n-1]
		qc.dirty = false
		if !qc.dead {
			q.flush(qc)
		}
	}
}

func (q *ClientQueue) flush(qc *qconn) {
	if qc.sb.Len() == 0 {
		return
	}
	if _, err := qc.sb.Post(qc.cn.qp); err != nil {
		qc.sb.Reset()
		q.fail(qc, "post send failed")
	}
}

// onPoll handles a wake-up of a connection's completion channel: take the
// events, re-arm the CQ, poll it empty, re-post receives, re-arm the poll.
// A connection that fails on the way is reaped only at the end, once
// nothing here touches its CQ or QP.
func (q *ClientQueue) onPoll(qc *qconn) {
	qc.pollOn = false
	if !qc.dead {
		qc.polling = true
		q.pollConn(qc)
		qc.polling = false
	}
	if qc.dead {
		q.reap(qc)
		return
	}
	q.armPoll(qc)
}

// pollConn is onPoll on a live connection; it stops at the first failure.
func (q *ClientQueue) pollConn(qc *qconn) {
	if err := qc.cn.drainEvents(); err != nil {
		q.fail(qc, "completion channel")
		return
	}
	total := 0
	for !qc.dead {
		n, err := qc.cn.cq.Poll(q.wcs)
		if err != nil {
			q.fail(qc, "poll CQ failed")
			break
		}
		total += n
		for i := range q.wcs[:n] {
			q.onWC(qc, &q.wcs[i])
		}
		if n < len(q.wcs) {
			break
		}
	}
	if total > 0 {
		qc.path.Stats().RecordPoll(q.id, total)
	}
	if qc.dead || qc.rb.Len() == 0 {
		return
	}
	if _, err := qc.rb.Post(qc.cn.qp); err != nil {
		qc.rb.Reset()
		q.fail(qc, "post recv failed")
	}
}

func (q *ClientQueue) onWC(qc *qconn, wc *rdma.WC) {
	if wc.Status != rdma.WCSuccess {
		q.fail(qc, wc.Status.String())
		return
	}
	if qc.dead || wc.Opcode&rdma.WCRecv == 0 {
		return // send completions
	}
	qc.path.Alive()
	slot := int(wc.WRID)
	qc.rb.Add(wc.WRID, qc.cn.recvSGE(slot))
	if !wc.HasImm() {
		return // SEND_WITH_INV: only re-post
	}
	m, err := q.c.params.Codec.Decode(wc.Imm)
	if err != nil || (m.Type != rtrs.ImmIORsp && m.Type != rtrs.ImmIORspWInv) {
		if err != nil {
			q.fail(qc, "bad immediate")
		}
		return
	}
	if wc.Opcode == rdma.WCRecv {
		// SEND-with-IMM: an RKEY_RSP (always_invalidate server).
		var rk rtrs.RkeyRsp
		b := qc.cn.rbuf[slot*recvSlot : (slot+1)*recvSlot]
		if wc.ByteLen < rtrs.RkeyRspSize || rk.Unmarshal(b) != nil || rk.CheckBufID(q.c.params.QueueDepth, m.BufID) != nil {
			q.fail(qc, "bad RKEY_RSP")
			return
		}
		qc.pc.chunks[m.BufID].RKey = rk.RKey
	}
	r, via := q.reqs.InFlight(m.BufID)
	if r == nil || via != qc {
		return // an answer on a path we already failed over from
	}
	q.reqs.Complete(r, m.Errno, qc.path.Stats())
}

// fail takes a connection out of service: its requests fail over to
// another path (with the same permit, hence the same chunk) or wait for
// one, and the path is told to reconnect.
func (q *ClientQueue) fail(qc *qconn, why string) {
	if qc.dead {
		return
	}
	qc.dead = true
	qc.sb.Reset()
	qc.pc.fail("queue %d: %s", q.id, why)
	if q.c.s.Fencing() && !q.reqs.Closed() && qc.pc.gen > qc.path.FencedGen() {
		// The server may still have these requests unread on this path.
		q.unfenced.Hold(qc)
	} else {
		q.reqs.FailOver(qc, qc.slot, qc.path.Stats())
	}
	if qc.pollOn {
		q.sqe().PrepPollRemove(q.udBase|udPoll|uint64(qc.slot), q.udBase|udCancel)
	}
	q.reap(qc)
}

// reap releases a dead connection once the ring no longer polls it.
func (q *ClientQueue) reap(qc *qconn) {
	if qc.pollOn || qc.polling || qc.reaped {
		return
	}
	qc.reaped = true
	qc.sb.Free()
	qc.rb.Free()
	if qc.slot < len(q.slots) && q.slots[qc.slot] == qc {
		q.slots[qc.slot] = nil
	}
	qc.pc.release(q.id)
}

var _ rtrs.Queue = (*ClientQueue)(nil)
