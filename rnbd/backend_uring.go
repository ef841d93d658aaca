package rnbd

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/procs"
	"github.com/urnbd/urnbd/uring"
)

// The server performs the reads, writes and flushes of file and block
// device exports through io_uring, so that a connection's requests overlap
// on the backend instead of waiting for each other. Each ring has one
// thread, its worker, which alone submits and reaps: the kernel completes
// block I/O by task work on the submitting thread, so a ring driven by
// one thread completes without hops between threads. A handler puts its
// request in the ring's queue and wakes the worker (an eventfd write) only
// when it sleeps; the worker completes the RTRS request when the backend
// answers. Discard and write zeroes (fallocate, with fallbacks) and memory
// exports stay synchronous.

// completer finishes an RTRS request: *tcp.ServerIO and *rdmatr.ServerIO.
type completer interface{ Complete(errno int) }

// ioEngine is a set of io_uring instances, one per CPU; a request goes to
// the next one in turn.
type ioEngine struct {
	rings []*ioRing
	next  atomic.Uint32
}

// ioRing is one io_uring and its worker thread.
type ioRing struct {
	ring  *uring.Ring // the worker's only
	wake  int         // eventfd the worker polls while it sleeps
	slots []ioSlot    // by user data; a slot belongs to whoever took it from free

	mu       sync.Mutex
	free     []uint32 // free slots
	queued   []uint32 // slots to submit
	sleeping bool     // the worker waits and must be woken
	stopping bool

	done chan struct{}
}

// ioSlot is a request on its way to the backend or in flight there.
type ioSlot struct {
	io   completer
	d    *mapping
	op   IOOp
	fua  bool
	off  int64
	data []byte
}

const (
	ioRingEntries = 256
	ioWakeData    = ^uint64(0) // user data of the poll on the wake eventfd
)

// newIOEngine starts one ring per CPU, or fails when io_uring is not
// available (then the server does its I/O synchronously).
func newIOEngine() (*ioEngine, error) {
	e := &ioEngine{}
	for range runtime.NumCPU() {
		ir, err := newIORing()
		if err != nil {
			e.close()
			return nil, fmt.Errorf("rnbd: backend io_uring: %w", err)
		}
		e.rings = append(e.rings, ir)
		go ir.work()
	}
	return e, nil
}

func newIORing() (*ioRing, error) {
	r, err := uring.New(ioRingEntries+1, 0) // +1: the wake poll
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	ir := &ioRing{ring: r, wake: wake, slots: make([]ioSlot, ioRingEntries), done: make(chan struct{}),
		queued: make([]uint32, 0, ioRingEntries)}
	for i := range ir.slots {
		ir.free = append(ir.free, uint32(i))
	}
	return ir, nil
}

// submit hands op on d's backend to a ring and reports whether it did; if
// not (every slot busy), the caller serves the request synchronously. On
// success d.refs stays raised until the completion.
func (e *ioEngine) submit(io completer, d *mapping, op IOOp, fua bool, off int64, data []byte) bool {
	ir := e.rings[e.next.Add(1)%uint32(len(e.rings))]
	ir.mu.Lock()
	if len(ir.free) == 0 || ir.stopping {
		ir.mu.Unlock()
		return false
	}
	slot := ir.free[len(ir.free)-1]
	ir.free = ir.free[:len(ir.free)-1]
	ir.slots[slot] = ioSlot{io: io, d: d, op: op, fua: fua, off: off, data: data}
	ir.queued = append(ir.queued, slot)
	wake := ir.sleeping
	ir.sleeping = false
	ir.mu.Unlock()
	if wake {
		ir.kick()
	}
	return true
}

// kick wakes the worker.
func (ir *ioRing) kick() {
	one := [8]byte{1}
	unix.Write(ir.wake, one[:])
}

// work is the ring's thread: it submits what handlers queued, completes
// what the backend answered, and sleeps in the ring when there is
// neither.
func (ir *ioRing) work() {
	runtime.LockOSThread()            // task work runs on the submitting thread
	defer procs.AddBlockingThread()() // it sleeps in io_uring_enter holding a P
	defer close(ir.done)
	batch := make([]uint32, 0, ioRingEntries)
	pollArmed := false
	var buf [8]byte
	var y procs.Yielder
	for {
		y.Tick()
		ir.mu.Lock()
		batch = append(batch[:0], ir.queued...)
		ir.queued = ir.queued[:0]
		idle := len(batch) == 0 && ir.ring.CQReady() == 0
		if ir.stopping && idle && len(ir.free) == len(ir.slots) {
			ir.mu.Unlock()
			return
		}
		ir.sleeping = idle
		ir.mu.Unlock()

		for _, slot := range batch {
			ir.prep(slot)
		}
		if idle && !pollArmed {
			if sqe := ir.ring.GetSQE(); sqe != nil {
				sqe.PrepPollAdd(int32(ir.wake), unix.POLLIN, false, ioWakeData)
				pollArmed = true
			}
		}
		wait := uint32(0)
		if idle {
			wait = 1
		}
		// With at most ioRingEntries requests and the poll in flight,
		// the completion queue (twice as long) cannot overflow.
		ir.ring.SubmitAndWait(wait)
		ir.ring.ForEachCQE(func(cqe *uring.CQE) {
			if cqe.UserData == ioWakeData {
				pollArmed = false
				unix.Read(ir.wake, buf[:])
				return
			}
			ir.complete(uint32(cqe.UserData), cqe.Res)
		})
	}
}

// prep turns a queued slot into a submission entry.
func (ir *ioRing) prep(slot uint32) {
	sqe, err := ir.ring.NextSQE() // room always: entries > slots
	if err != nil {
		panic(fmt.Sprintf("rnbd: backend ring: submit: %v", err))
	}
	prepBackend(sqe, &ir.slots[slot], uint64(slot))
}

// prepBackend prepares sqe for the backend operation of s (a read, a
// write or a flush), with user data ud.
func prepBackend(sqe *uring.SQE, s *ioSlot, ud uint64) {
	fd := int32(s.d.be.fd)
	switch s.op {
	case OpRead:
		sqe.PrepRead(fd, unsafe.Pointer(unsafe.SliceData(s.data)), uint32(len(s.data)), uint64(s.off), ud)
	case OpWrite:
		sqe.PrepWrite(fd, unsafe.Pointer(unsafe.SliceData(s.data)), uint32(len(s.data)), uint64(s.off), ud)
		if s.fua {
			sqe.OpFlags = unix.RWF_DSYNC
		}
	default: // OpFlush
		sqe.PrepFsync(fd, uring.FsyncDatasync, ud)
	}
}

// complete ends the request of slot with the backend's result.
func (ir *ioRing) complete(slot uint32, res int32) {
	s := ir.slots[slot]
	ir.slots[slot] = ioSlot{}
	errno := s.finish(res)
	ir.mu.Lock()
	ir.free = append(ir.free, slot)
	ir.mu.Unlock()
	s.d.refs.Add(-1)
	s.io.Complete(errno)
}

// finish turns a completion into 0 or -errno, doing what a short read or
// write left undone synchronously.
func (s *ioSlot) finish(res int32) int {
	if res < 0 {
		return int(res)
	}
	n := int(res)
	if s.op == OpFlush || n == len(s.data) {
		return 0
	}
	rest, off := s.data[n:], s.off+int64(n)
	var err error
	if s.op == OpRead {
		err = fullIO(unix.Pread, s.d.be.fd, rest, off)
	} else {
		err = fullIO(unix.Pwrite, s.d.be.fd, rest, off)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return -int(errno)
	}
	if err != nil {
		return -int(syscall.EIO)
	}
	return 0
}

// close stops the workers once the requests in flight are done, and
// frees the rings. No request may be submitted any more.
func (e *ioEngine) close() {
	for _, ir := range e.rings {
		ir.mu.Lock()
		ir.stopping = true
		ir.sleeping = false
		ir.mu.Unlock()
		ir.kick()
		<-ir.done
		ir.ring.Close()
		unix.Close(ir.wake)
	}
	e.rings = nil
}
