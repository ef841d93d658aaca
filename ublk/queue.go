package ublk

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/procs"
	"github.com/urnbd/urnbd/uring"
)

// Queue is one hardware queue of a device: one OS thread, pinned to the CPUs
// that the kernel maps to the queue, around one io_uring. Its exported
// methods may be called only from a QueueHandler, on the queue's thread.
type Queue struct {
	id     uint16
	depth  int
	maxIO  int
	charFd int32
	cpus   unix.CPUSet

	ring    *uring.Ring
	descMem []byte
	descs   []IODesc
	bufs    []byte
	reqs    []Request
	handler QueueHandler
	flusher Flusher          // handler, if it batches
	onCQE   func(*uring.CQE) // q.handleCQE, made once so reaping does not allocate

	live    int  // per-tag protocol: tags that the kernel has not aborted
	handed  int  // tags with the handler, not completed
	batchIO bool // the device runs the batch protocol (FlagBatchIO)
	// autoBufReg: the kernel installs each request's pages as fixed
	// buffer (tag) of the ring (FlagAutoBufReg), and no data is copied.
	autoBufReg bool
	copier     copier      // CopyToRequest and CopyFromRequest, with autoBufReg
	batch      *batchQueue // its state, made by setup
	err        error

	// Handover: draining is set from another thread and wakeFd, an
	// eventfd the ring polls (the Device's, which closes it), written;
	// drain is the loop's copy, which dispatch reads. drainLeft is the
	// loop's count of requests still with the handler, for Handover's
	// error.
	draining  atomic.Bool
	drain     bool
	wakeFd    int
	drainLeft atomic.Int32
	// tid is the queue's thread; a drained queue leaves its ring in
	// orphan for the Device to close once that thread is gone.
	tid    int
	orphan *uring.Ring
}

// userDataWake is the user data of the poll of wakeFd.
const userDataWake = 1 << 59

// ID returns the queue's index.
func (q *Queue) ID() uint16 { return q.id }

// Depth returns the number of tags of the queue.
func (q *Queue) Depth() int { return q.depth }

// Ring returns the queue's io_uring. A QueueHandler may submit its own
// entries to it, with user data made by TargetUserData, and get their
// completions in OnCompletion.
func (q *Queue) Ring() *uring.Ring { return q.ring }

// Buffer returns the whole I/O buffer of tag (MaxIOBytes long).
func (q *Queue) Buffer(tag uint16) []byte {
	off := int(tag) * q.maxIO
	return q.bufs[off : off+q.maxIO : off+q.maxIO]
}

// GetSQE returns a free submission entry of the queue's ring, submitting
// what is pending first if the submission queue is full.
func (q *Queue) GetSQE() *uring.SQE {
	sqe, err := q.ring.NextSQE()
	if err != nil {
		// The ring is broken; nothing this queue can do but stop.
		panic(fmt.Sprintf("ublk queue %d: submit: %v", q.id, err))
	}
	return sqe
}

// Complete ends request tag with res: the number of bytes transferred for a
// read or write, 0 for other successful operations, or a negative errno.
// It queues the tag's COMMIT_AND_FETCH_REQ, which also fetches the next
// request for the tag, or, in the batch protocol, adds the result to the
// commit that the queue sends when the handler's round ends.
func (q *Queue) Complete(tag uint16, res int32) {
	q.handed--
	if q.batch != nil {
		q.completeBatch(tag, res)
		return
	}
	q.queueCmd(opCommitAndFetchReq, tag, res)
}

// bufAddr returns the address of tag's buffer, as the kernel takes it.
func (q *Queue) bufAddr(tag uint16) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(q.bufs)))) + uint64(int(tag)*q.maxIO)
}

func (q *Queue) queueCmd(op uint32, tag uint16, res int32) {
	sqe := q.GetSQE()
	sqe.PrepUringCmd(q.charFd, op, uint64(tag))
	cmd := ioCmdOf(sqe)
	cmd.QueueID = q.id
	cmd.Tag = tag
	cmd.Result = res
	if q.autoBufReg {
		// struct ublk_auto_buf_reg, in the entry's own addr (not the
		// command's): the slot, no flags.
		sqe.Addr = uint64(tag)
		return
	}
	cmd.Addr = q.bufAddr(tag)
}

// pow2AtLeast returns the least power of two that is n or more.
func pow2AtLeast(n int) uint32 {
	v := uint32(1)
	for v < uint32(n) {
		v <<= 1
	}
	return v
}

// ioCmdOf returns the 16-byte command area of a 64-byte entry: sqe->cmd at
// offset 48, over Addr3 and the padding after it. Set after PrepUringCmd.
func ioCmdOf(sqe *uring.SQE) *IOCmd {
	return (*IOCmd)(unsafe.Pointer(&sqe.Addr3))
}

// setup maps the descriptor area and makes the ring; on the queue's thread.
func (q *Queue) setup(target Target) error {
	pageSize := unix.Getpagesize()
	mem, err := unix.Mmap(int(q.charFd), descAreaOffset(int(q.id), pageSize),
		descAreaLen(q.depth, pageSize), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("queue %d: mmap descriptors: %w", q.id, err)
	}
	q.descMem = mem
	q.descs = unsafe.Slice((*IODesc)(unsafe.Pointer(&mem[0])), q.depth)

	entries := pow2AtLeast(2 * q.depth)
	// One thread submits, and reaps completions only when it waits.
	q.ring, err = uring.NewLoop(entries)
	if err != nil {
		return fmt.Errorf("queue %d: %w", q.id, err)
	}
	q.reqs = make([]Request, q.depth)
	q.onCQE = q.handleCQE
	q.handler, err = target.NewQueue(q)
	if err != nil {
		return fmt.Errorf("queue %d: target: %w", q.id, err)
	}
	q.flusher, _ = q.handler.(Flusher)
	q.GetSQE().PrepPollAdd(int32(q.wakeFd), unix.POLLIN, false, userDataWake)
	if q.autoBufReg {
		if err := q.ring.RegisterBuffersSparse(uint32(q.depth)); err != nil {
			return fmt.Errorf("queue %d: %w", q.id, err)
		}
	}
	if q.batchIO {
		return q.setupBatch()
	}
	for tag := 0; tag < q.depth; tag++ {
		q.queueCmd(opFetchReq, uint16(tag), 0)
	}
	q.live = q.depth
	if _, err := q.ring.Submit(); err != nil {
		return fmt.Errorf("queue %d: submit FETCH_REQ: %w", q.id, err)
	}
	return nil
}

// run is the queue's goroutine: setup, then the event loop until every tag
// is aborted (the device was stopped or deleted).
func (q *Queue) run(target Target, ready chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The process's main thread: the runtime never lets it exit
		// (it parks it instead), and a handover needs the queue's
		// thread to exit before its ring closes. Serve from another
		// thread; holding this one meanwhile keeps the new goroutine
		// off it.
		done := make(chan struct{})
		go func() {
			defer close(done)
			q.run(target, ready)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	q.tid = unix.Gettid()
	defer procs.AddBlockingThread()() // the loop sleeps in io_uring_enter holding a P
	// The thread stays locked: it exits with the goroutine rather than
	// going back to the scheduler with a narrowed CPU affinity.
	if q.cpus.Count() > 0 {
		if err := unix.SchedSetaffinity(0, &q.cpus); err != nil {
			ready <- fmt.Errorf("queue %d: set CPU affinity: %w", q.id, err)
			return
		}
	}
	if err := q.setup(target); err != nil {
		q.teardown()
		ready <- err
		return
	}
	ready <- nil
	if err := q.loop(); err != nil {
		q.err = err
	}
	q.teardown()
}

func (q *Queue) loop() error {
	var y procs.Yielder
	for q.running() {
		if q.draining.Load() {
			q.drain = true
			if q.drainDone() {
				_, err := q.ring.Submit() // the last results
				return err
			}
		}
		y.Tick()
		if _, err := q.ring.SubmitAndWait(1); err != nil {
			return fmt.Errorf("queue %d: %w", q.id, err)
		}
		q.ring.ForEachCQE(q.onCQE)
		if q.flusher != nil {
			q.flusher.Flush()
		}
		if q.batch != nil {
			q.flushCommits()
		}
	}
	return nil
}

// running reports whether the queue has work left: tags the kernel may
// still hand out or that wait for their results to be committed.
func (q *Queue) running() bool {
	if b := q.batch; b != nil {
		return !b.aborted || q.handed > 0 || b.pending > 0 || b.inflight > 0
	}
	return q.live > 0
}

func (q *Queue) handleCQE(cqe *uring.CQE) {
	switch {
	case cqe.UserData&userDataTarget != 0:
		q.handler.OnCompletion(cqe.UserData, cqe.Res, cqe.Flags)
		return
	case cqe.UserData == userDataWake:
		return // a handover: the loop sees draining
	case cqe.UserData&userDataCopy != 0:
		q.copyDone(cqe)
		return
	case q.batch != nil:
		q.handleBatchCQE(cqe)
		return
	}
	tag := uint16(cqe.UserData)
	switch cqe.Res {
	case ioResOK:
	case ioResAbort:
		// The device is stopping: the tag is finished.
		q.live--
		return
	default:
		// The kernel refused the command; the tag is lost to this queue.
		q.fail(fmt.Errorf("queue %d tag %d: command refused: %w", q.id, tag, unix.Errno(-cqe.Res)))
		q.live--
		return
	}
	q.dispatch(tag)
}

// dispatch hands the request in tag's descriptor to the handler, unless
// the queue drains for a handover: then the request stays with the kernel,
// which issues it again to the next server.
func (q *Queue) dispatch(tag uint16) {
	if q.drain {
		return
	}
	q.handed++
	d := &q.descs[tag]
	req := &q.reqs[tag]
	req.Op = d.Op()
	req.Flags = d.OpFlags &^ 0xff
	req.StartSector = d.StartSector
	req.NrSectors = d.NrSectors
	req.Buf = nil
	req.Fixed, req.BufIndex = false, 0
	if req.Op == OpRead || req.Op == OpWrite {
		n := int(d.NrSectors) << 9
		if n > q.maxIO {
			q.Complete(tag, -int32(unix.EINVAL))
			return
		}
		if q.autoBufReg {
			req.Fixed, req.BufIndex = true, tag
			req.Buf = q.Buffer(tag)[:n] // scratch
		} else {
			req.Buf = q.Buffer(tag)[:n]
		}
	}
	q.handler.Handle(tag, req)
}

func (q *Queue) teardown() {
	if q.handler != nil {
		q.handler.Close()
		q.handler = nil
	}
	q.copier.close()
	if q.batch != nil && q.batch.fetchBufs != nil {
		q.batch.fetchBufs.Close()
	}
	if q.ring != nil && q.drain {
		// A handover: the thread exits with the ring open, as a dead
		// server's would, and the kernel's exit path cancels the
		// queue's commands. Linux 6.12 loses a request whose delivery
		// was under way if the ring closes first, while the thread
		// lives: its quiesce then waits for that request for ever.
		q.orphan, q.ring = q.ring, nil
	}
	if q.ring != nil {
		q.ring.Close()
		q.ring = nil
	}
	if q.descMem != nil {
		unix.Munmap(q.descMem)
		q.descMem, q.descs = nil, nil
	}
}
