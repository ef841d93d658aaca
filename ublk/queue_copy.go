package ublk

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/uring"
)

// Copies between a zero-copy request's pages (FlagAutoBufReg: fixed buffer
// tag of the queue's ring) and memory of the target, for a target that
// moves only part of the data straight between the pages and its peer: a
// network transport that receives a read's first bytes into a buffer of
// its own and the rest into the pages, or sends a write's data from its own
// buffer.
//
// io_uring has no operation that copies between user memory and a fixed
// buffer, and the driver's user copy (read and write of the char device at
// a request's position, FlagUserCopy) would run on an io-wq worker each
// time: the char device can neither be polled nor read without blocking.
// A pipe can: each copy is two linked entries through a pipe of its own,
// WRITE into it and READ_FIXED out of it into the request (or WRITE_FIXED
// of the request into it and READ out of it). The first is done inline in
// the io_uring_enter that submits it; the second, a linked one, runs as
// task work after the entries of that submission, so copies in one
// submission must not share a pipe. The queue keeps a pool of pipes, each
// holding the largest request; one that a failed copy may have left bytes
// in is closed, not reused.

// userDataCopy marks the two entries of a copy, the tag in the low 16 bits;
// copyFirst marks the first (into the pipe).
const (
	userDataCopy = 1 << 58
	copyFirst    = 1 << 57
)

// copyPipe is one pipe of a queue's pool.
type copyPipe struct{ r, w int }

// copier is a queue's pool of copy pipes and its copies in the ring.
type copier struct {
	free []copyPipe
	pipe []copyPipe // per tag: the pipe of its copy
	want []int32    // per tag: the copy's length
	err  []int32    // per tag: the copy's error, when known before its last entry
	ud   []uint64   // per tag: the target's user data
	// base is the address io_uring takes for byte 0 of each tag's fixed
	// buffer: nil (0) for the driver's pages; tests register user memory.
	base []uint64
}

// fixedAddr returns the io_uring address of byte off of tag's fixed buffer.
func (c *copier) fixedAddr(tag uint16, off int) uint64 {
	if c.base != nil {
		return c.base[tag] + uint64(off)
	}
	return uint64(off)
}

// CopyToRequest copies buf into the pages of request tag (Request.Fixed)
// from byte off on. Its result, len(buf) or a negative errno, comes to the
// handler's OnCompletion with userData; one copy per tag at a time.
func (q *Queue) CopyToRequest(tag uint16, off int, buf []byte, userData uint64) {
	q.copy(tag, off, buf, true, userData)
}

// CopyFromRequest copies the data of request tag from byte off on into
// buf, as CopyToRequest.
func (q *Queue) CopyFromRequest(tag uint16, off int, buf []byte, userData uint64) {
	q.copy(tag, off, buf, false, userData)
}

func (q *Queue) copy(tag uint16, off int, buf []byte, toRequest bool, userData uint64) {
	c := &q.copier
	if c.ud == nil {
		c.pipe, c.want, c.err, c.ud = make([]copyPipe, q.depth), make([]int32, q.depth), make([]int32, q.depth), make([]uint64, q.depth)
	}
	c.ud[tag], c.want[tag], c.err[tag] = userData, int32(len(buf)), 0
	ud := userDataCopy | uint64(tag)
	var err error
	if !q.autoBufReg || off < 0 || off+len(buf) > q.maxIO || len(buf) == 0 {
		err = unix.EINVAL
	} else {
		c.pipe[tag], err = c.get(q.maxIO)
	}
	if err != nil {
		// Reported through the ring, as any copy's result.
		c.err[tag] = -int32(unix.EINVAL)
		if errno, ok := err.(unix.Errno); ok {
			c.err[tag] = -int32(errno)
		}
		q.GetSQE().PrepNop(ud)
		return
	}
	if err := q.ring.Reserve(2); err != nil {
		panic("ublk queue: submit: " + err.Error())
	}
	p := c.pipe[tag]
	first, second := q.GetSQE(), q.GetSQE()
	mem, n := unsafe.Pointer(unsafe.SliceData(buf)), uint32(len(buf))
	if toRequest {
		first.PrepWrite(int32(p.w), mem, n, ^uint64(0), ud|copyFirst)
		second.PrepReadFixedAt(int32(p.r), c.fixedAddr(tag, off), n, ^uint64(0), tag, ud)
	} else {
		first.PrepWriteFixedAt(int32(p.w), c.fixedAddr(tag, off), n, ^uint64(0), tag, ud|copyFirst)
		second.PrepRead(int32(p.r), mem, n, ^uint64(0), ud)
	}
	first.Flags |= uring.SQEIOLink
}

// get takes a pipe from the pool, or makes one that holds size bytes.
func (c *copier) get(size int) (copyPipe, error) {
	if n := len(c.free); n > 0 {
		p := c.free[n-1]
		c.free = c.free[:n-1]
		return p, nil
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return copyPipe{}, err
	}
	got, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, size)
	if err == nil && got < size {
		err = unix.ENOMEM
	}
	p := copyPipe{r: fds[0], w: fds[1]}
	if err != nil {
		p.close()
		return copyPipe{}, err
	}
	return p, nil
}

func (p copyPipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// close closes the pool's pipes; those of copies in the ring close with
// the ring's end (the queue's teardown).
func (c *copier) close() {
	for _, p := range c.free {
		p.close()
	}
	c.free = nil
	for i, p := range c.pipe {
		if p.w != 0 {
			p.close()
			c.pipe[i] = copyPipe{}
		}
	}
}

// copyDone handles the completion of a copy's entry.
func (q *Queue) copyDone(cqe *uring.CQE) {
	c := &q.copier
	tag := uint16(cqe.UserData)
	if int(tag) >= len(c.ud) {
		return
	}
	if cqe.UserData&copyFirst != 0 {
		if cqe.Res != c.want[tag] {
			c.err[tag] = errnoOr(cqe.Res) // the second entry is cancelled or short
		}
		return
	}
	res := cqe.Res
	if c.err[tag] != 0 {
		res = c.err[tag]
	} else if res != c.want[tag] {
		res = errnoOr(res)
	}
	if p := c.pipe[tag]; p.w != 0 {
		if res < 0 {
			p.close() // it may hold bytes of this copy
		} else {
			c.free = append(c.free, p)
		}
		c.pipe[tag] = copyPipe{}
	}
	q.handler.OnCompletion(c.ud[tag], res, 0)
}

// errnoOr returns res if it is an errno, else -EIO (a short transfer).
func errnoOr(res int32) int32 {
	if res < 0 {
		return res
	}
	return -int32(unix.EIO)
}
