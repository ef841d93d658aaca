package ublk

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/uring"
)

// The batch protocol of FlagBatchIO (Linux 7.0), as docs/ublk.md describes
// it: tags are not tied to commands. PREP_IO_CMDS hands the kernel every
// tag's buffer once; one multishot FETCH_IO_CMDS then posts, into buffers
// of a provided-buffer ring, the tags of the requests that arrive, many per
// completion; and COMMIT_IO_CMDS ends many requests at once. A queue thus
// issues one commit per loop iteration instead of one command per request.

// User data of the queue's batch commands. Tag commands of the per-tag
// protocol use the low 16 bits only, and userDataTarget marks the
// handler's entries.
const (
	userDataFetch  = 1 << 62
	userDataCommit = 1 << 61 // | commit slot
	userDataPrep   = 1 << 60
)

// commitSlots is the number of COMMIT_IO_CMDS that may be in flight at
// once. The kernel copies the elements in when it issues the command, which
// it normally does inline; a slot stays busy until its completion anyway,
// in case the command went to a worker.
const commitSlots = 4

// fetchGroup is the buffer group of the fetch buffers; the queue's ring has
// no other.
const fetchGroup = 0

// batchQueue is the state of a queue that runs the batch protocol.
type batchQueue struct {
	fetchBufs  *uring.BufRing
	fetchMem   []byte // fetchBufs' buffers, fetchBufLen bytes each
	fetchBufLn int

	fetching bool // the FETCH_IO_CMDS is armed
	aborted  bool // the kernel ended the fetch for good: the queue is stopping

	prepDone bool
	prepRes  int32

	// elemWords is the size of an element in 64-bit words: 2 with the
	// buffer address, 1 with automatic buffer registration.
	elemWords int
	// commits are the element buffers of COMMIT_IO_CMDS; cur is the one
	// that Complete fills (never in flight), pending its elements.
	commits  [commitSlots][]uint64
	busy     [commitSlots]bool
	queued   [commitSlots]int // elements of each busy slot
	inflight int
	cur      int
	pending  int
}

// setupBatch prepares every tag with PREP_IO_CMDS, waits for its result,
// and arms the fetch.
func (q *Queue) setupBatch() error {
	b := &batchQueue{elemWords: 2}
	if q.autoBufReg {
		b.elemWords = 1
	}
	q.batch = b
	entries := pow2AtLeast(q.depth)
	var err error
	if b.fetchBufs, err = q.ring.RegisterBufRing(entries, fetchGroup); err != nil {
		return fmt.Errorf("queue %d: %w", q.id, err)
	}
	// One completion carries at most maxFetchTags tags, and each uses a
	// buffer: with as many buffers as tags the ring never runs dry.
	b.fetchBufLn = 2 * min(q.depth, maxFetchTags)
	b.fetchMem = make([]byte, int(entries)*b.fetchBufLn)
	for i := range entries {
		b.fetchBufs.Add(unsafe.Pointer(&b.fetchMem[int(i)*b.fetchBufLn]), uint32(b.fetchBufLn), uint16(i))
	}
	b.fetchBufs.Advance()
	for i := range b.commits {
		b.commits[i] = make([]uint64, q.depth*b.elemWords)
	}

	elems := make([]uint64, q.depth*b.elemWords)
	for tag := range q.depth {
		b.putElem(elems, tag, uint16(tag), 0, q.bufAddr(uint16(tag)))
	}
	q.queueBatchCmd(opPrepIOCmds, userDataPrep, elems)
	for !b.prepDone {
		if _, err := q.ring.SubmitAndWait(1); err != nil {
			return fmt.Errorf("queue %d: submit PREP_IO_CMDS: %w", q.id, err)
		}
		q.ring.ForEachCQE(q.onCQE)
	}
	if b.prepRes < 0 {
		return fmt.Errorf("queue %d: PREP_IO_CMDS: %w", q.id, unix.Errno(-b.prepRes))
	}
	q.armFetch()
	if _, err := q.ring.Submit(); err != nil {
		return fmt.Errorf("queue %d: submit FETCH_IO_CMDS: %w", q.id, err)
	}
	return nil
}

// putElem writes element i of elems: tag's header, with the tag's
// fixed-buffer slot (itself), and the buffer address if elements carry one.
func (b *batchQueue) putElem(elems []uint64, i int, tag uint16, res int32, bufAddr uint64) {
	w := elems[i*b.elemWords:]
	*(*ElemHeader)(unsafe.Pointer(&w[0])) = ElemHeader{Tag: tag, BufIndex: tag, Result: res}
	if b.elemWords == 2 {
		w[1] = bufAddr
	}
}

// elemTag returns the tag of element i of elems.
func (b *batchQueue) elemTag(elems []uint64, i int) uint16 {
	return (*ElemHeader)(unsafe.Pointer(&elems[i*b.elemWords])).Tag
}

// queueBatchCmd queues a PREP_IO_CMDS or COMMIT_IO_CMDS over elems.
func (q *Queue) queueBatchCmd(op uint32, userData uint64, elems []uint64) {
	b := q.batch
	sqe := q.GetSQE()
	sqe.PrepUringCmd(q.charFd, op, userData)
	sqe.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(elems))))
	cmd := BatchCmd{QueueID: q.id, NrElem: uint16(len(elems) / b.elemWords), ElemBytes: uint8(8 * b.elemWords)}
	if b.elemWords == 2 {
		cmd.Flags = batchHasBufAddr
	}
	*batchCmdOf(sqe) = cmd
}

// armFetch queues the multishot FETCH_IO_CMDS.
func (q *Queue) armFetch() {
	sqe := q.GetSQE()
	sqe.PrepUringCmd(q.charFd, opFetchIOCmds, userDataFetch)
	sqe.Flags |= uring.SQEBufferSelect
	sqe.BufIndex = fetchGroup
	sqe.OpFlags = uring.UringCmdMultishot
	*batchCmdOf(sqe) = BatchCmd{QueueID: q.id, ElemBytes: 2}
	q.batch.fetching = true
}

// batchCmdOf returns the command area of sqe as a BatchCmd, as ioCmdOf.
func batchCmdOf(sqe *uring.SQE) *BatchCmd {
	return (*BatchCmd)(unsafe.Pointer(&sqe.Addr3))
}

// completeBatch adds tag's result to the commit being filled.
func (q *Queue) completeBatch(tag uint16, res int32) {
	b := q.batch
	b.putElem(b.commits[b.cur], b.pending, tag, res, q.bufAddr(tag))
	b.pending++
}

// flushCommits queues the filled commit, if a slot is free to fill next;
// otherwise the elements wait for the next iteration.
func (q *Queue) flushCommits() {
	b := q.batch
	if b.pending == 0 {
		return
	}
	next := -1
	for i := 1; i < commitSlots; i++ {
		if s := (b.cur + i) % commitSlots; !b.busy[s] {
			next = s
			break
		}
	}
	if next < 0 {
		return
	}
	q.queueBatchCmd(opCommitIOCmds, userDataCommit|uint64(b.cur), b.commits[b.cur][:b.pending*b.elemWords])
	b.busy[b.cur] = true
	b.queued[b.cur] = b.pending
	b.inflight++
	b.cur, b.pending = next, 0
}

// handleBatchCQE handles the completion of a batch command.
func (q *Queue) handleBatchCQE(cqe *uring.CQE) {
	b := q.batch
	switch {
	case cqe.UserData&userDataFetch != 0:
		q.handleFetch(cqe)
	case cqe.UserData&userDataCommit != 0:
		q.handleCommit(int(cqe.UserData&^userDataCommit), cqe.Res)
	case cqe.UserData&userDataPrep != 0:
		b.prepDone, b.prepRes = true, cqe.Res
	}
}

func (q *Queue) handleFetch(cqe *uring.CQE) {
	b := q.batch
	if cqe.Flags&uring.CQEFBuffer != 0 {
		bid := cqe.BufferID()
		buf := b.fetchMem[int(bid)*b.fetchBufLn : int(bid+1)*b.fetchBufLn]
		n := min(max(int(cqe.Res), 0), len(buf)) / 2
		for _, tag := range unsafe.Slice((*uint16)(unsafe.Pointer(&buf[0])), n) {
			if int(tag) >= q.depth {
				q.fail(fmt.Errorf("queue %d: FETCH_IO_CMDS gave tag %d of %d: %w", q.id, tag, q.depth, unix.EPROTO))
				continue
			}
			q.dispatch(tag)
		}
		b.fetchBufs.Add(unsafe.Pointer(&buf[0]), uint32(b.fetchBufLn), bid)
		b.fetchBufs.Advance()
	}
	if cqe.Flags&uring.CQEFMore != 0 {
		return
	}
	b.fetching = false
	switch cqe.Res {
	case ioResAbort:
		// The device is stopping (or its queue was cancelled).
		b.aborted = true
	case -int32(unix.ENOBUFS):
		// No buffer, or no room to post: the tags wait in the kernel.
		q.armFetch()
	default:
		if cqe.Res < 0 {
			q.fail(fmt.Errorf("queue %d: FETCH_IO_CMDS: %w", q.id, unix.Errno(-cqe.Res)))
		}
		b.aborted = true
	}
}

// handleCommit handles the completion of the commit in slot: the number of
// bytes of elements the kernel consumed, or an errno if it consumed none.
// The kernel stops at the first element it refuses; that tag is lost to the
// queue (as a refused COMMIT_AND_FETCH_REQ is), and the ones after it are
// committed again.
func (q *Queue) handleCommit(slot int, res int32) {
	b := q.batch
	elems := b.commits[slot]
	n := b.queued[slot]
	b.busy[slot] = false
	b.inflight--
	done := 0
	if res > 0 {
		done = int(res) / (8 * b.elemWords)
	}
	if done < n {
		if !b.aborted {
			why := "see the kernel log"
			if res < 0 {
				why = unix.Errno(-res).Error()
			}
			q.fail(fmt.Errorf("queue %d tag %d: COMMIT_IO_CMDS refused the result (%s): %w", q.id, b.elemTag(elems, done), why, unix.EIO))
		}
		ew := b.elemWords
		copy(b.commits[b.cur][b.pending*ew:], elems[(done+1)*ew:n*ew])
		b.pending += n - done - 1
	}
}

// fail records the queue's first error.
func (q *Queue) fail(err error) {
	if q.err == nil {
		q.err = err
	}
}
