package tcp

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/clientq"
	"github.com/urnbd/urnbd/rtrs/internal/session"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
	"github.com/urnbd/urnbd/uring"
)

// ClientQueue is one per-CPU queue of a client session: the requests
// submitted on one thread go out on that queue's IO connection of the path
// the policy picks, and their completions come back on the same thread,
// through the same io_uring. All its methods but Run and Do must be
// called on the queue's thread (from Run's start function or a Done
// callback).
type ClientQueue struct {
	core    clientq.Core[*qconn, attachMsg]
	c       *Client
	frames  []sendFrame // by permit id: the frame of the request holding it
	scratch []byte      // per permit id: frame header, user message, RTRS header
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

// attachMsg hands a queue its IO connection of one connect of a path.
type attachMsg struct {
	path *session.Path
	fd   int
	gen  uint64
}

// qconn is a queue's IO connection on one path.
type qconn struct {
	clientq.ConnState
	q  *ClientQueue
	fd int
	// rx and tx count the bytes read and written, against renew
	// (ClientConfig.RenewAfter; 0: never).
	rx, tx, renew int64
	dec           *frame.Decoder
	rbuf          []byte
	sendq         permitRing // the requests to write, by permit, in order
	iov           [64]unix.Iovec
	riov          [2]unix.Iovec // a direct RECV's: the payload tail, then rbuf
	recvOn        bool          // a RECV is in the ring
	direct        bool          // that RECV reads into the payload of a frame first, then rbuf
	large         bool          // the last frame had a large payload: see armRecv
	largeFixed    bool          // and went into a fixed buffer
	// placed is the request whose answer's payload is being read, as
	// Place gave it, and placedLen that payload's length.
	placed    *Request
	placedLen int
	// failOver: the connection failed while a direct RECV was in the ring;
	// its requests fail over when that RECV ends, not before, or the
	// kernel could still copy stale data into a buffer already reused.
	failOver bool
	// unfenced: the connection failed and the server may still have its
	// requests unread; they fail over once the path is fenced.
	unfenced bool
	pollOn   bool // a POLLOUT is in the ring
}

// User data of the queue's ring entries: kind in bits 56..59 (the core
// owns clientq.UDWake), slot below.
const (
	udRecv    = 1 << 56
	udPollOut = 2 << 56
)

func newClientQueue(c *Client, id int) (*ClientQueue, error) {
	qd := c.params.QueueDepth
	stride := frame.HeaderSize + c.params.MaxHdrSize
	q := &ClientQueue{c: c, frames: make([]sendFrame, qd), scratch: make([]byte, qd*stride)}
	if err := q.core.Init("rtrs/tcp", c.s, c.queueSet, id, (*queueTransport)(q)); err != nil {
		return nil, err
	}
	return q, nil
}

// queueTransport is the queue as its core's clientq.Transport.
type queueTransport ClientQueue

// ID returns the queue's index.
func (q *ClientQueue) ID() int { return q.core.ID }

// Run runs the queue's event loop on the calling goroutine, locked to its
// OS thread (pin the thread to a CPU before, if wanted), with its own
// io_uring. start is called once on the thread before the loop; Run
// returns when the client is closed.
func (q *ClientQueue) Run(start func()) error { return q.core.Run(start) }

// Do runs fn on the queue's thread, soon. It may be called from any
// goroutine; it is for control work, not for each request.
func (q *ClientQueue) Do(fn func()) { q.core.Do(fn) }

// HandleCQE handles a completion of one of the queue's entries.
func (q *ClientQueue) HandleCQE(cqe *uring.CQE) { q.core.HandleCQE(cqe) }

// Flush writes the frames queued since the last Flush, many per system
// call. The event loop that drives the queue calls it after each batch of
// completions (Run does).
func (q *ClientQueue) Flush() { q.core.Flush() }

// Attach makes the queue use ring, an io_uring owned by the calling
// thread's event loop: the queue submits entries with user data
// base|(kind<<56)|slot and the loop hands their completions to HandleCQE.
// base must leave bits 56..59 and the low 32 bits clear.
//
// A queue may be attached again, to another ring, once the ring it was
// attached to is gone (the entries in it died with it): its connections'
// reads are armed in the new ring.
func (q *ClientQueue) Attach(ring *uring.Ring, base uint64) {
	(*queueTransport)(q).AttachRing(ring, base)
}

// AttachRing implements clientq.Transport (Attach).
func (t *queueTransport) AttachRing(ring *uring.Ring, base uint64) bool {
	if !t.state.CompareAndSwap(queueIdle, queueDriven) && !t.state.CompareAndSwap(queueDetached, queueDriven) {
		return false // closed: the client is gone
	}
	t.core.SetRing(ring, base)
	for _, qc := range t.core.Slots {
		if qc == nil {
			continue
		}
		qc.recvOn, qc.pollOn, qc.direct = false, false, false
		t.endFailOver(qc)
		if qc.Dead {
			t.reap(qc)
			continue
		}
		t.armRecv(qc)
		if !qc.sendq.empty() {
			t.core.MarkDirty(qc)
		}
	}
	return true
}

// Detach tells the queue that the event loop driving it stops: its ring
// is closed next, and the queue's entries in it die. The connections stay
// for a later Attach; once the client is closed, Detach (or Close, for a
// queue already detached or never driven) closes them and the mailbox.
// Call it on the queue's thread, as the last thing the loop does with the
// queue.
func (q *ClientQueue) Detach() { (*queueTransport)(q).Detach() }

// Detach implements clientq.Transport.
func (t *queueTransport) Detach() {
	t.core.SetRing(nil, 0)
	t.state.Store(queueDetached)
	if t.core.Reqs.Closed() {
		(*ClientQueue)(t).closeUndriven()
	}
}

// Busy implements clientq.Transport: a connection waits for its direct
// RECV to end before its requests fail over (and, once closed, fail).
func (t *queueTransport) Busy() bool {
	for _, qc := range t.core.Slots {
		if qc != nil && qc.failOver {
			return true
		}
	}
	return false
}

// closeUndriven closes the sockets and the mailbox of a closed client's
// queue that no loop drives (any more), once: by Detach on the queue's
// thread, or by Client.Close for a queue detached or never driven.
func (q *ClientQueue) closeUndriven() {
	if !q.state.CompareAndSwap(queueDetached, queueClosed) && !q.state.CompareAndSwap(queueIdle, queueClosed) {
		return
	}
	// Connections handed over but never taken.
	q.core.CloseMailbox(func(a attachMsg) { unix.Close(a.fd) })
	for _, qc := range q.core.Slots {
		if qc != nil && qc.fd >= 0 {
			unix.Close(qc.fd)
			qc.fd = -1
		}
	}
}

// HandleCQE implements clientq.Transport.
func (t *queueTransport) HandleCQE(cqe *uring.CQE) {
	ud := cqe.UserData
	switch ud & clientq.UDKind {
	case udRecv:
		t.onRecv(t.core.SlotConn(ud), cqe.Res)
	case udPollOut:
		qc := t.core.SlotConn(ud)
		if qc == nil {
			return
		}
		qc.pollOn = false
		if qc.Dead {
			t.reap(qc)
			return
		}
		t.FlushConn(qc)
	}
}

// Unfence implements clientq.Transport.
func (t *queueTransport) Unfence(qc *qconn) {
	qc.unfenced = false
	if !qc.failOver {
		t.core.FailOver(qc)
	}
}

// AttachConn implements clientq.Transport.
func (t *queueTransport) AttachConn(a attachMsg) {
	qc := &qconn{ConnState: clientq.ConnState{Path: a.path, Gen: a.gen, Slot: a.path.Index()},
		q: (*ClientQueue)(t), fd: a.fd, dec: frame.NewDecoder(frame.ToClient), rbuf: make([]byte, 256<<10),
		sendq: newPermitRing(t.c.params.QueueDepth), renew: t.c.renewAfter}
	qc.dec.SetSession(t.c.params.Codec, qc)
	if old := t.core.SlotConn(uint64(qc.Slot)); old != nil {
		t.Fail(old, "replaced")
	}
	t.core.SetSlot(qc)
	t.armRecv(qc)
}

func (t *queueTransport) armRecv(qc *qconn) {
	qc.recvOn = true
	qc.direct = false
	s := t.core.SQE()
	ud := t.core.UDBase | udRecv | uint64(qc.Slot)
	tail := qc.dec.PayloadTail()
	if r := qc.placed; len(tail) > 0 && r != nil && r.Fixed && &tail[len(tail)-1] == &r.Data[qc.placedLen-1] {
		// The rest of the payload into the request's own fixed buffer,
		// once any of it goes there: what came with the header is in Data
		// (Split).
		if off := qc.placedLen - len(tail); r.Split < qc.placedLen || len(tail) >= directRecvMin {
			r.Split = min(r.Split, off)
			qc.direct = true
			s.PrepReadFixedAt(int32(qc.fd), r.FixedBase+uint64(off), uint32(len(tail)), ^uint64(0), r.BufIndex, ud)
			return
		}
	}
	if len(tail) >= directRecvMin {
		// The rest of the payload straight into place, and in the same
		// read what follows it (the next answer's header) into rbuf: a
		// large answer then costs one RECV, not one for its payload and
		// another for the next header.
		qc.direct = true
		qc.riov[0].Base, qc.riov[0].Len = &tail[0], uint64(len(tail))
		qc.riov[1].Base, qc.riov[1].Len = &qc.rbuf[0], uint64(headRead)
		s.PrepReadv(int32(qc.fd), qc.riov[:], ^uint64(0), ud)
		return
	}
	buf := qc.rbuf
	if len(tail) == 0 && qc.large {
		// Large answers come in a row: read little beyond the next
		// header, and the rest of its payload straight into place; into
		// a fixed buffer, nothing beyond the header, which would have to
		// be copied in after.
		buf = qc.rbuf[:headRead]
		if qc.largeFixed {
			buf = qc.rbuf[:frame.HeaderSize]
		}
	}
	s.PrepRead(int32(qc.fd), unsafe.Pointer(&buf[0]), uint32(len(buf)), ^uint64(0), ud)
}

// directRecvMin is the least payload still to come that is read straight
// into its buffer rather than into rbuf and copied: large read answers
// then cross memory once instead of twice. Smaller rests are not worth
// the extra RECV.
const directRecvMin = 16 << 10

// headRead is how much of rbuf a read takes where a large answer's header
// is due: the header and a little of what follows, not the payload.
const headRead = directRecvMin / 4

// Submit sends r. It never blocks: without a free permit or a usable path
// the request waits in the queue, and is sent when a permit is returned or
// a path comes up. It returns an error only for a request that can never
// be sent (too large); then Done is not called.
func (q *ClientQueue) Submit(r *Request) error {
	if err := q.c.params.CheckRequest(r); err != nil {
		return fmt.Errorf("rtrs/tcp: %w", err)
	}
	q.core.Reqs.Submit(r)
	return nil
}

// Send implements clientq.Transport: r's frame is written at the next
// flush.
func (t *queueTransport) Send(r *Request, permit int, qc *qconn) error {
	if err := t.buildFrame(r, permit); err != nil {
		return err
	}
	qc.sendq.push(permit)
	t.core.Queued(qc)
	return nil
}

// buildFrame lays out the frame of r, holding permit id, in its scratch
// slot: header, then for a write the data and the user message +
// RdmaWriteMsg, for a read the user message + RdmaReadMsg with one
// descriptor naming the reply's length.
func (t *queueTransport) buildFrame(r *Request, id int) error {
	p := t.c.params
	stride := frame.HeaderSize + p.MaxHdrSize
	buf := t.scratch[id*stride : (id+1)*stride]
	f := &t.frames[id]
	tail := buf[frame.HeaderSize:]
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
		f.parts[0], f.parts[1], f.parts[2] = buf[:frame.HeaderSize], r.Data, tail[:n]
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
		f.parts[0], f.parts[1], f.parts[2] = buf[:frame.HeaderSize+n], nil, nil
	}
	h, err := frame.IOReqHeader(p.Codec, uint32(id), l)
	if err != nil {
		return err
	}
	h.MarshalTo(buf[:frame.HeaderSize])
	f.len, f.sent = frame.HeaderSize+int(l.WriteLen), 0
	return nil
}

// FlushConn implements clientq.Transport: it writes queued frames until
// the socket is full (then a POLLOUT is armed) or the queue is empty.
func (t *queueTransport) FlushConn(qc *qconn) {
	if qc.pollOn {
		return // the POLLOUT's completion flushes
	}
	for !qc.sendq.empty() {
		n := 0
		for i := 0; i < qc.sendq.len() && n+3 <= len(qc.iov); i++ {
			n += t.frames[qc.sendq.at(i)].iovecs((*[3]unix.Iovec)(qc.iov[n : n+3]))
		}
		w, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(qc.fd), uintptr(unsafe.Pointer(&qc.iov[0])), uintptr(n))
		switch {
		case errno == unix.EAGAIN:
			qc.pollOn = true
			t.core.SQE().PrepPollAdd(int32(qc.fd), unix.POLLOUT, false, t.core.UDBase|udPollOut|uint64(qc.Slot))
			return
		case errno == unix.EINTR:
			continue
		case errno != 0:
			t.Fail(qc, "write failed")
			return
		}
		qc.tx += int64(w)
		for left := int(w); left > 0; {
			f := &t.frames[qc.sendq.at(0)]
			k := min(left, f.len-f.sent)
			f.sent += k
			left -= k
			if f.sent == f.len {
				qc.sendq.pop()
			}
		}
	}
}

func (t *queueTransport) onRecv(qc *qconn, res int32) {
	if qc == nil {
		return
	}
	direct := qc.direct
	qc.recvOn, qc.direct = false, false
	if qc.Dead {
		t.endFailOver(qc)
		t.reap(qc)
		return
	}
	if res <= 0 {
		if res == -int32(unix.EINTR) || res == -int32(unix.EAGAIN) {
			t.armRecv(qc)
			return
		}
		t.Fail(qc, "read failed")
		return
	}
	qc.rx += int64(res)
	if qc.renew != 0 && max(qc.rx, qc.tx) >= qc.renew {
		// After the frames of this read: its answers complete first.
		defer t.renew(qc)
	}
	frames := 0
	defer func() { qc.Path.Stats().RecordPoll(t.core.ID, frames) }()
	var b []byte
	if !direct {
		b = qc.rbuf[:res]
	} else {
		// The payload tail is what it was when the RECV was armed: only
		// this loop feeds the decoder.
		n := min(int(res), len(qc.dec.PayloadTail()))
		f, err := qc.dec.Filled(n)
		if err != nil {
			t.Fail(qc, "bad frame")
			return
		}
		if f != nil {
			frames++
			qc.setLarge(f)
			if !t.onFrame(qc, f) {
				return
			}
		}
		b = qc.rbuf[:int(res)-n]
	}
	for len(b) > 0 {
		n, f, err := qc.dec.Feed(b)
		b = b[n:]
		if err != nil {
			t.Fail(qc, "bad frame")
			return
		}
		if f == nil {
			break
		}
		frames++
		qc.setLarge(f)
		if !t.onFrame(qc, f) {
			return
		}
	}
	t.armRecv(qc)
}

// setLarge notes whether frame f, just read, had a large payload, and
// whether that went into a fixed buffer.
func (qc *qconn) setLarge(f *frame.Frame) {
	qc.large = len(f.Payload) >= directRecvMin
	r := qc.placed
	qc.largeFixed = qc.large && r != nil && r.Fixed && &f.Payload[0] == &r.Data[0]
}

// onFrame completes the request that frame f answers. It returns false if
// the frame was bad and failed the connection.
func (t *queueTransport) onFrame(qc *qconn, f *frame.Frame) bool {
	if f.Imm.Type != rtrs.ImmIORsp {
		return true // heartbeats are the service connection's business
	}
	r, via := t.core.Reqs.InFlight(f.Imm.BufID)
	if r == nil || via != qc {
		t.Fail(qc, "answer to no request sent here")
		return false
	}
	errno := f.Imm.Errno
	if errno == 0 && !r.Write && int(f.Len) != len(r.Data) {
		errno = -int(syscall.EIO)
	}
	t.core.Reqs.Complete(f.Imm.BufID, errno, qc.Path.Stats())
	return true
}

// Place implements Placer: a read's data goes straight into its buffer.
func (qc *qconn) Place(f *frame.Frame) ([]byte, error) {
	r, via := qc.q.core.Reqs.InFlight(f.Imm.BufID)
	if r == nil || r.Write || via != qc || int(f.Len) > len(r.Data) {
		return nil, fmt.Errorf("rtrs/tcp: %d bytes of read data for request %d: %w", f.Len, f.Imm.BufID, rtrs.ErrOutOfRange)
	}
	qc.placed, qc.placedLen, r.Split = r, int(f.Len), int(f.Len)
	return r.Data[:f.Len], nil
}

// renew takes a connection that has carried its byte budget out of
// service, so that its path reconnects with new TLS keys.
func (t *queueTransport) renew(qc *qconn) {
	if !qc.Dead {
		t.Fail(qc, fmt.Sprintf("carried %d bytes in, %d out: reconnecting for new TLS keys (budget %d)", qc.rx, qc.tx, qc.renew))
	}
}

// Fail implements clientq.Transport: it takes a connection out of
// service: its requests fail over to another path (or wait for one, or
// for the path to be fenced), the path is reported failed, and the socket
// is shut down so the ring's entries on it end.
func (t *queueTransport) Fail(qc *qconn, why string) {
	if qc.Dead {
		return
	}
	qc.Dead = true
	unix.Shutdown(qc.fd, unix.SHUT_RDWR)
	// Dropped when the path took its connections back itself (detach).
	qc.Path.Failed(qc.Gen, "queue %d: IO connection: %s", t.core.ID, why)
	qc.sendq.clear()
	qc.unfenced = t.core.Hold(qc) // see qconn.unfenced
	if qc.recvOn && qc.direct {
		qc.failOver = true // when the RECV ends: see qconn.failOver
	} else if !qc.unfenced {
		t.core.FailOver(qc)
	}
	t.reap(qc)
}

// endFailOver fails over a dead connection's requests if Fail postponed it
// until its direct RECV ended.
func (t *queueTransport) endFailOver(qc *qconn) {
	if qc.failOver {
		qc.failOver = false
		if !qc.unfenced {
			t.core.FailOver(qc)
		}
	}
}

// reap closes a dead connection once the ring no longer refers to it.
func (t *queueTransport) reap(qc *qconn) {
	if qc.recvOn || qc.pollOn || qc.fd < 0 {
		return
	}
	unix.Close(qc.fd)
	qc.fd = -1
	t.core.ClearSlot(qc)
}

var _ rtrs.Queue = (*ClientQueue)(nil)
