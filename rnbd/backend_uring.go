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

	"github.com/urnbd/urnbd/uring"
)

// The server performs the reads, writes and flushes of file and block
// device exports through io_uring, so that a connection's requests overlap
// on the backend instead of waiting for each other: the handler submits
// and returns, and a reaper thread completes the RTRS request when the
// backend answers. Discard and write zeroes (fallocate, with fallbacks)
// and memory exports stay synchronous.

// completer finishes an RTRS request: *tcp.ServerIO and *rdmatr.ServerIO.
type completer interface{ Complete(errno int) }

// ioEngine is a set of io_uring instances, one per CPU; a request goes to
// the next one in turn.
type ioEngine struct {
	rings []*ioRing
	next  atomic.Uint32
}

// ioRing is one io_uring with a reaper goroutine. Submissions are
// serialised by mu (the submission queue has one producer); the reaper
// alone consumes completions.
type ioRing struct {
	mu       sync.Mutex
	ring     *uring.Ring
	slots    []ioSlot // by user data
	free     []uint32 // free slots, under mu
	stopping bool     // reaper only
	done     chan struct{}
}

// ioSlot is a request in flight on the backend.
type ioSlot struct {
	io   completer
	d    *mapping
	op   IOOp
	off  int64
	data []byte
}

const (
	ioRingEntries = 256
	ioStopData    = ^uint64(0) // user data of the NOP that stops a reaper
)

// newIOEngine starts one ring per CPU, or fails when io_uring is not
// available (then the server does its I/O synchronously).
func newIOEngine() (*ioEngine, error) {
	e := &ioEngine{}
	for range runtime.NumCPU() {
		r, err := uring.New(ioRingEntries, 0)
		if err != nil {
			e.close()
			return nil, fmt.Errorf("rnbd: backend io_uring: %w", err)
		}
		ir := &ioRing{ring: r, slots: make([]ioSlot, ioRingEntries), done: make(chan struct{})}
		for i := range ir.slots {
			ir.free = append(ir.free, uint32(i))
		}
		e.rings = append(e.rings, ir)
		go ir.reap()
	}
	return e, nil
}

// submit starts op on d's backend and reports whether it did; if not (no
// free slot, a full ring), the caller serves the request synchronously.
// On success d.refs stays raised until the completion.
func (e *ioEngine) submit(io completer, d *mapping, op IOOp, fua bool, off int64, data []byte) bool {
	ir := e.rings[e.next.Add(1)%uint32(len(e.rings))]
	ir.mu.Lock()
	defer ir.mu.Unlock()
	if len(ir.free) == 0 {
		return false
	}
	sqe := ir.ring.GetSQE()
	if sqe == nil {
		return false
	}
	slot := ir.free[len(ir.free)-1]
	fd := int32(d.be.fd)
	switch op {
	case OpRead:
		sqe.PrepRead(fd, unsafe.Pointer(unsafe.SliceData(data)), uint32(len(data)), uint64(off), uint64(slot))
	case OpWrite:
		sqe.PrepWrite(fd, unsafe.Pointer(unsafe.SliceData(data)), uint32(len(data)), uint64(off), uint64(slot))
		if fua {
			sqe.OpFlags = unix.RWF_DSYNC
		}
	default: // OpFlush
		sqe.PrepFsync(fd, uring.FsyncDatasync, uint64(slot))
	}
	ir.free = ir.free[:len(ir.free)-1]
	ir.slots[slot] = ioSlot{io: io, d: d, op: op, off: off, data: data}
	// With no more requests in flight than entries, the completion queue
	// (twice as long) cannot overflow, so the kernel takes the entry.
	ir.ring.Submit()
	return true
}

// reap completes requests as the backend answers them.
func (ir *ioRing) reap() {
	defer close(ir.done)
	for {
		cqe, err := ir.ring.WaitCQE()
		if err != nil {
			return
		}
		ud, res := cqe.UserData, cqe.Res
		ir.ring.CQESeen()
		if ud != ioStopData {
			// The slot is read under mu, which its submitter held while
			// filling it: the kernel's ordering is not visible to Go's.
			ir.mu.Lock()
			s := ir.slots[ud]
			ir.slots[ud] = ioSlot{}
			ir.free = append(ir.free, uint32(ud))
			ir.mu.Unlock()
			errno := s.finish(res)
			s.d.refs.Add(-1)
			s.io.Complete(errno)
		} else {
			ir.stopping = true
		}
		if ir.stopping {
			ir.mu.Lock()
			idle := len(ir.free) == len(ir.slots)
			ir.mu.Unlock()
			if idle {
				return
			}
		}
	}
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

// close stops the reapers once the requests in flight are done, and
// frees the rings. No request may be submitted any more.
func (e *ioEngine) close() {
	for _, ir := range e.rings {
		ir.mu.Lock()
		if sqe := ir.ring.GetSQE(); sqe != nil {
			sqe.PrepNop(ioStopData)
			ir.ring.Submit()
		}
		ir.mu.Unlock()
		<-ir.done
		ir.ring.Close()
	}
	e.rings = nil
}
