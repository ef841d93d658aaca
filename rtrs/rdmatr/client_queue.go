package rdmatr

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/clientq"
	"github.com/urnbd/urnbd/uring"
)

// Request is one IO request of a client (see rtrs.Request). Its Data must
// lie inside the client's registered Region (Client.Region); the user
// message may live anywhere, it is copied into registered memory.
type Request = rtrs.Request

// ClientQueue is one per-CPU queue of a client session: the requests
// submitted on one thread go out on that queue's IO connection of the path
// the policy picks, and their completions come back on the same thread:
// the queue's io_uring waits on the completion channels of its
// connections (conn.armWait, made anew after each wake-up). All its methods but
// Run and Do must be called on the queue's thread (from Run's start
// function or a Done callback).
type ClientQueue struct {
	core clientq.Core[*qconn, attachMsg]
	c    *Client
	wcs  []rdma.WC

	started atomic.Bool
	exited  chan struct{}
	// driven is set once an event loop drives the queue (Attach, Run):
	// only then can it take and release path connections.
	driven atomic.Bool
}

// attachMsg hands a queue its IO connection of one connect of a path.
type attachMsg struct {
	pc *pathConns
	cn *conn
}

// qconn is a queue's IO connection on one path.
type qconn struct {
	clientq.ConnState
	q      *ClientQueue
	pc     *pathConns
	cn     *conn
	sb     *rdma.SendBatch
	rb     *rdma.RecvBatch
	sent   int // requests posted, for signalInterval
	pollOn bool
	// polling is set while onPoll handles the connection's completions:
	// a fail meanwhile (an error completion, a Done callback whose
	// request fails to post) must not reap it, since releasing the set
	// lets the path goroutine free the CQ that onPoll still polls.
	polling bool
	reaped  bool
}

// User data of the queue's ring entries: kind in bits 56..59 (the core
// owns clientq.UDWake), slot below.
const (
	udPoll   = 1 << 56
	udCancel = 4 << 56
	udEvRead = 5 << 56 // the READ of a completion event before a wait: see conn.armWait
)

func newClientQueue(c *Client, id int) (*ClientQueue, error) {
	q := &ClientQueue{c: c, exited: make(chan struct{}), wcs: make([]rdma.WC, 64)}
	if err := q.core.Init("rtrs/rdmatr", c.s, c.queueSet, id, (*queueTransport)(q)); err != nil {
		return nil, err
	}
	return q, nil
}

// queueTransport is the queue as its core's clientq.Transport.
type queueTransport ClientQueue

// ID returns the queue's index.
func (q *ClientQueue) ID() int { return q.core.ID }

// Run runs the queue's event loop on the calling goroutine, locked to its
// OS thread, with its own io_uring. start is called once on the thread
// before the loop; Run returns when the client is closed.
func (q *ClientQueue) Run(start func()) error {
	q.started.Store(true)
	defer close(q.exited)
	return q.core.Run(start)
}

// Do runs fn on the queue's thread, soon. It may be called from any
// goroutine; it is for control work, not for each request.
func (q *ClientQueue) Do(fn func()) { q.core.Do(fn) }

// HandleCQE handles a completion of one of the queue's entries.
func (q *ClientQueue) HandleCQE(cqe *uring.CQE) { q.core.HandleCQE(cqe) }

// Flush posts the work requests queued since the last Flush, one
// ibv_post_send per connection. The event loop that drives the queue
// calls it after each batch of completions (Run does).
func (q *ClientQueue) Flush() { q.core.Flush() }

// Busy implements clientq.Transport: ring entries still refer to
// connections.
func (t *queueTransport) Busy() bool {
	for _, qc := range t.core.Slots {
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
	(*queueTransport)(q).AttachRing(ring, base)
}

// AttachRing implements clientq.Transport (Attach).
func (t *queueTransport) AttachRing(ring *uring.Ring, base uint64) bool {
	t.driven.Store(true) // before the mailbox is drained and failed is read: see teardown
	t.core.SetRing(ring, base)
	for _, qc := range t.core.Slots {
		if qc != nil && !qc.Dead && qc.pc.failed.Load() {
			// Its path went down while the queue was detached: the
			// path may have let go of it for the queue and freed it
			// (see Detach). Fail it without touching its CQ or QP.
			qc.pollOn = false
			t.Fail(qc, "path went down while the queue was detached")
			continue
		}
		if qc == nil || !qc.pollOn {
			continue
		}
		qc.pollOn = false
		qc.cn.dropWait()
		if qc.Dead {
			t.reap(qc)
			continue
		}
		t.armPoll(qc)
	}
	return true
}

// Detach tells the queue that the event loop driving it stops: its ring
// is closed next, and the queue's entries in it die. Until the queue is
// attached again, a path that goes down lets go of the queue's claim on
// its connections itself, instead of waiting (Config.Timeout) for a queue
// that no loop drives and then leaking them; a path already down is let
// go of here. Call it on the queue's thread, as the last thing the loop
// does with the queue.
func (q *ClientQueue) Detach() { (*queueTransport)(q).Detach() }

// Detach implements clientq.Transport.
func (t *queueTransport) Detach() {
	for _, qc := range t.core.Slots {
		if qc != nil && qc.pollOn && !qc.reaped {
			// The wait dies with the ring. While the queue is driven
			// no path frees the CQ: before driven is cleared.
			qc.cn.dropWait()
		}
	}
	t.driven.Store(false) // before failed is read: see teardown
	for _, qc := range t.core.Slots {
		if qc != nil && qc.pc.failed.Load() {
			qc.pc.release(t.core.ID)
		}
	}
	t.core.SetRing(nil, 0)
}

func (t *queueTransport) armPoll(qc *qconn) {
	qc.pollOn = true
	slot := uint64(qc.Slot)
	if err := qc.cn.armWait(t.core.Ring, t.core.UDBase|udEvRead|slot, t.core.UDBase|udPoll|slot); err != nil {
		panic(fmt.Sprintf("rtrs/rdmatr client queue %d: submit: %v", t.core.ID, err))
	}
}

// HandleCQE implements clientq.Transport.
func (t *queueTransport) HandleCQE(cqe *uring.CQE) {
	switch cqe.UserData & clientq.UDKind {
	case udPoll:
		if qc := t.core.SlotConn(cqe.UserData); qc != nil {
			t.onPoll(qc, cqe.Res)
		}
	case udEvRead:
		// It failed (conn.armWait); the wait's POLL_ADD, after it in
		// the ring, is still to complete.
		if qc := t.core.SlotConn(cqe.UserData); qc != nil && !qc.Dead {
			if err := qc.cn.readFailed(cqe.Res); err != nil {
				t.Fail(qc, err.Error())
			}
		}
	}
}

// Unfence implements clientq.Transport.
func (t *queueTransport) Unfence(qc *qconn) { t.core.FailOver(qc) }

// AttachConn implements clientq.Transport.
func (t *queueTransport) AttachConn(a attachMsg) {
	pc := a.pc
	idx := pc.p.Index()
	if old := t.core.SlotConn(uint64(idx)); old != nil {
		t.Fail(old, "replaced")
		if !old.reaped {
			// Its poll is still in the ring; the new set takes the slot
			// once it is reaped. Rare (reconnect faster than a poll).
			t.core.PostAttach(a)
			return
		}
	}
	if pc.failed.Load() || t.core.Reqs.Closed() {
		pc.release(t.core.ID)
		return
	}
	qc := &qconn{ConnState: clientq.ConnState{Path: pc.p, Gen: pc.gen, Slot: idx},
		q: (*ClientQueue)(t), pc: pc, cn: a.cn,
		sb: rdma.NewSendBatch(64, 2), rb: rdma.NewRecvBatch(a.cn.nrecv, 1)}
	t.core.SetSlot(qc)
	t.armPoll(qc)
}

// Submit sends r. It never blocks: without a free permit or a usable path
// the request waits in the queue, and is sent when a permit is returned or
// a path comes up. It returns an error only for a request that can never
// be sent (too large, or Data outside the registered region); then Done
// is not called.
func (q *ClientQueue) Submit(r *Request) error {
	if err := q.c.params.CheckRequest(r); err != nil {
		return fmt.Errorf("rtrs/rdmatr: %w", err)
	}
	if r.Fixed {
		return fmt.Errorf("rtrs/rdmatr: a request in a fixed buffer of the ring: RDMA reaches only the registered region: %w", syscall.EINVAL)
	}
	if _, _, ok := q.c.regionPart(r.Data); !ok {
		return fmt.Errorf("rtrs/rdmatr: request data is not inside one registered part of the region: %w", syscall.EINVAL)
	}
	q.core.Reqs.Submit(r)
	return nil
}

// Send implements clientq.Transport: r's work request is added to qc's
// batch, posted at the next flush or at once when the batch is full.
func (t *queueTransport) Send(r *Request, permit int, qc *qconn) error {
	if err := t.addWR(qc, r, permit); err != nil {
		if errors.Is(err, errPartUnregistered) {
			// The set was failing when the part was registered, and is
			// going: r fails over with its other requests.
			t.Fail(qc, err.Error())
			return nil
		}
		return err
	}
	t.core.Queued(qc)
	if qc.sb.Len() == qc.sb.Cap() {
		t.FlushConn(qc)
	}
	return nil
}

// errPartUnregistered: a request's data lies in a region part that its
// connection's set did not register (see RegisterPart).
var errPartUnregistered = errors.New("region part not registered")

// addWR builds the header of r, holding permit id, (user message + RTRS header) in its slot of the
// registered header area and adds its RDMA-WRITE-with-IMM to qc's batch:
// a write gathers [data, header] to the chunk base; a read writes only
// the header, with one descriptor naming its buffer in the region, to
// chunk base + D.
func (t *queueTransport) addWR(qc *qconn, r *Request, id int) error {
	c, pc := t.c, qc.pc
	p := c.params
	hs := p.MaxHdrSize
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

// FlushConn implements clientq.Transport: one ibv_post_send for what
// was queued on qc.
func (t *queueTransport) FlushConn(qc *qconn) {
	if qc.sb.Len() == 0 {
		return
	}
	if _, err := qc.sb.Post(qc.cn.qp); err != nil {
		qc.sb.Reset()
		t.Fail(qc, "post send failed")
	}
}

// onPoll handles a wake-up of a connection's completion channel: take the
// events, re-arm the CQ, poll it empty, re-post receives, re-arm the poll.
// A connection that fails on the way is reaped only at the end, once
// nothing here touches its CQ or QP.
func (t *queueTransport) onPoll(qc *qconn, res int32) {
	qc.pollOn = false
	if err := qc.cn.endWait(res); err != nil && !qc.Dead {
		t.Fail(qc, err.Error())
	}
	if !qc.Dead {
		qc.polling = true
		t.pollConn(qc)
		qc.polling = false
	}
	if qc.Dead {
		t.reap(qc)
		return
	}
	t.armPoll(qc)
}

// pollConn is onPoll on a live connection; it stops at the first failure.
func (t *queueTransport) pollConn(qc *qconn) {
	if err := qc.cn.rearm(); err != nil {
		t.Fail(qc, "completion channel")
		return
	}
	total := 0
	for !qc.Dead {
		n, err := qc.cn.cq.Poll(t.wcs)
		if err != nil {
			t.Fail(qc, "poll CQ failed")
			break
		}
		total += n
		for i := range t.wcs[:n] {
			t.onWC(qc, &t.wcs[i])
		}
		if n < len(t.wcs) {
			break
		}
	}
	if total > 0 {
		qc.Path.Stats().RecordPoll(t.core.ID, total)
	}
	if qc.Dead || qc.rb.Len() == 0 {
		return
	}
	if _, err := qc.rb.Post(qc.cn.qp); err != nil {
		qc.rb.Reset()
		t.Fail(qc, "post recv failed")
	}
}

func (t *queueTransport) onWC(qc *qconn, wc *rdma.WC) {
	if wc.Status != rdma.WCSuccess {
		t.Fail(qc, wc.Status.String())
		return
	}
	if qc.Dead || wc.Opcode&rdma.WCRecv == 0 {
		return // send completions
	}
	qc.Path.Alive()
	slot := int(wc.WRID)
	qc.rb.Add(wc.WRID, qc.cn.recvSGE(slot))
	if !wc.HasImm() {
		return // SEND_WITH_INV: only re-post
	}
	m, err := t.c.params.Codec.Decode(wc.Imm)
	if err != nil || (m.Type != rtrs.ImmIORsp && m.Type != rtrs.ImmIORspWInv) {
		if err != nil {
			t.Fail(qc, "bad immediate")
		}
		return
	}
	if wc.Opcode == rdma.WCRecv {
		// SEND-with-IMM: an RKEY_RSP (always_invalidate server).
		var rk rtrs.RkeyRsp
		b := qc.cn.rbuf[slot*recvSlot : (slot+1)*recvSlot]
		if wc.ByteLen < rtrs.RkeyRspSize || rk.Unmarshal(b) != nil || rk.CheckBufID(t.c.params.QueueDepth, m.BufID) != nil {
			t.Fail(qc, "bad RKEY_RSP")
			return
		}
		qc.pc.chunks[m.BufID].RKey = rk.RKey
	}
	r, via := t.core.Reqs.InFlight(m.BufID)
	if r == nil || via != qc {
		return // an answer on a path we already failed over from
	}
	t.core.Reqs.Complete(m.BufID, m.Errno, qc.Path.Stats())
}

// Fail implements clientq.Transport: it takes a connection out of
// service: its requests fail over to another path (with the same permit,
// hence the same chunk), wait for one, or wait for the path to be fenced,
// and the path is told to reconnect.
func (t *queueTransport) Fail(qc *qconn, why string) {
	if qc.Dead {
		return
	}
	qc.Dead = true
	qc.sb.Reset()
	qc.pc.fail("queue %d: %s", t.core.ID, why)
	if !t.core.Hold(qc) {
		t.core.FailOver(qc)
	}
	if qc.pollOn {
		t.core.SQE().PrepPollRemove(t.core.UDBase|udPoll|uint64(qc.Slot), t.core.UDBase|udCancel)
	}
	t.reap(qc)
}

// reap releases a dead connection once the ring no longer polls it.
func (t *queueTransport) reap(qc *qconn) {
	if qc.pollOn || qc.polling || qc.reaped {
		return
	}
	qc.reaped = true
	qc.sb.Free()
	qc.rb.Free()
	t.core.ClearSlot(qc)
	qc.pc.release(t.core.ID)
}

var _ rtrs.Queue = (*ClientQueue)(nil)
