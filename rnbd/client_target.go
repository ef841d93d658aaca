package rnbd

import (
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
	"github.com/urnbd/urnbd/uring"
)

// target is the ublk target of a mapped device: ublk queue i hands its
// requests to RTRS queue i on the same thread and io_uring, with the tag's
// buffer as the request's data: over RDMA the device reads and writes it
// directly; over TCP writes are sent from it and read data of 16 KiB and
// more is read into it straight from the socket, smaller read data is
// copied once from the connection's receive buffer.
//
// Over TCP with MapOptions.ZeroCopy, where the driver offers it
// (ublk.FlagAutoBufReg), the
// requests' own pages are in the ring instead (ublk.ZeroCopier): the
// socket's reads put the end of a read's answer of 16 KiB or more straight
// into them, and what came into the tag's buffer (the answer's first bytes,
// or all of a small one) is copied into them after; a write's data is
// copied from them into the tag's buffer before it is sent.
type target struct{ d *Device }

// ZeroCopy implements ublk.ZeroCopier: when asked for, over TCP (not over
// RDMA, whose adapter reaches only the registered region).
func (t *target) ZeroCopy() bool { return t.d.zeroCopy && t.d.c.t.fixedReads }

// queue is one ublk queue's half of the target.
type queue struct {
	d     *Device
	uq    *ublk.Queue
	rq    *blockQueue
	buf   [][]byte // each tag's data, for the completion's byte count
	fixed []bool   // each tag's: a read into the request's own pages (zero copy)
	usr   [][IOSize]byte
	cqe   uring.CQE
}

// User data of the queue's copies between a tag's buffer and its
// request's pages (ublk.Queue.CopyFromRequest, CopyToRequest), tag in the
// low 16 bits; the RTRS queue's entries use bits 56-59 and below.
const (
	udCopyIn  = 1 << 62 // a write's data, before it is sent
	udCopyOut = 1 << 61 // a read's data that came into the tag's buffer
)

func (t *target) NewQueue(uq *ublk.Queue) (ublk.QueueHandler, error) {
	q := &queue{d: t.d, uq: uq, buf: make([][]byte, uq.Depth()), fixed: make([]bool, uq.Depth()), usr: make([][IOSize]byte, uq.Depth())}
	q.rq = t.d.c.t.blockQueue(t.d.block, int(uq.ID()), unix.Gettid(), uq.Ring(), ublk.TargetUserData(0), uq.Depth(), q.done)
	t.d.mu.Lock()
	t.d.queues = append(t.d.queues, q)
	t.d.mu.Unlock()
	return q, nil
}

// setDeviceID puts the device's new id into every tag's RNBD header: the
// requests waiting in RTRS after a reconnect go out with it (reopen).
func (q *queue) setDeviceID(id uint32) {
	for tag := range q.usr {
		setIODeviceID(q.usr[tag][:], id)
	}
}

// rnbdOp maps a ublk operation to RNBD's.
func rnbdOp(op uint8) (IOOp, bool) {
	switch op {
	case ublk.OpRead:
		return OpRead, true
	case ublk.OpWrite:
		return OpWrite, true
	case ublk.OpFlush:
		return OpFlush, true
	case ublk.OpDiscard:
		return OpDiscard, true
	case ublk.OpWriteZeroes:
		return OpWriteZeroes, true
	}
	return 0, false
}

func (q *queue) Handle(tag uint16, req *ublk.Request) {
	op, ok := rnbdOp(req.Op)
	if !ok {
		q.uq.Complete(tag, -int32(syscall.EOPNOTSUPP))
		return
	}
	var flags uint32
	switch {
	case op == OpFlush:
		// A block-layer flush is FLUSH+PREFLUSH: sent as the kernel's 2.1
		// client does, with FUA for a 2.0 server.
		flags = FlagSync | FlagFUA | FlagPreflush
	case req.Flags&ublk.IOFlagFUA != 0:
		flags = FlagSync | FlagFUA
	case op == OpRead:
		flags = FlagSync
	case op == OpWriteZeroes && req.Flags&ublk.IOFlagNoUnmap != 0:
		flags = FlagNoUnmap
	}
	m := IO{DeviceID: q.d.id.Load(), Sector: req.StartSector, RW: MakeRW(op, flags), BiSize: uint32(req.Len())}
	if op == OpFlush {
		// A flush has no range (the block layer leaves its sector at -1).
		m.Sector, m.BiSize = 0, 0
	}
	usr := q.usr[tag][:]
	if _, err := m.MarshalTo(usr); err != nil {
		q.uq.Complete(tag, -int32(syscall.EINVAL))
		return
	}
	q.buf[tag] = req.Buf
	q.fixed[tag] = req.Fixed && op == OpRead
	if req.Fixed && op == OpWrite {
		// The data is in the request's pages only: into the tag's buffer.
		q.uq.CopyFromRequest(tag, 0, req.Buf, ublk.TargetUserData(udCopyIn|uint64(tag)))
		return
	}
	q.send(tag, !op.RTRSRead())
}

// send submits the RNBD message and data of tag to RTRS.
func (q *queue) send(tag uint16, write bool) {
	if err := q.rq.submit(tag, write, q.fixed[tag], q.usr[tag][:], q.buf[tag]); err != nil {
		q.uq.Complete(tag, -int32(syscall.EINVAL))
	}
}

func (q *queue) done(tag uint16, errno int) {
	if errno == 0 && q.fixed[tag] {
		if n := q.rq.split(tag); n > 0 {
			q.uq.CopyToRequest(tag, 0, q.buf[tag][:n], ublk.TargetUserData(udCopyOut|uint64(tag)))
			return
		}
	}
	q.complete(tag, int32(errno))
}

// complete ends the request of tag: res 0 is success, with all its bytes.
func (q *queue) complete(tag uint16, res int32) {
	if res == 0 {
		res = int32(len(q.buf[tag]))
	}
	q.uq.Complete(tag, res)
}

func (q *queue) OnCompletion(ud uint64, res int32, flags uint32) {
	v := ublk.TargetValue(ud)
	tag := uint16(v)
	switch {
	case v&udCopyIn != 0:
		if res < 0 {
			q.uq.Complete(tag, res)
			return
		}
		q.send(tag, true)
	case v&udCopyOut != 0:
		q.complete(tag, min(res, 0))
	default:
		q.cqe = uring.CQE{UserData: ud, Res: res, Flags: flags}
		q.rq.q.HandleCQE(&q.cqe)
	}
}

func (q *queue) Flush()       { q.rq.q.Flush() }
func (q *queue) Close() error { q.rq.q.Detach(); return nil }
