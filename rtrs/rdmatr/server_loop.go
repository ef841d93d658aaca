package rdmatr

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/procs"
	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs/internal/clientq"
	"github.com/urnbd/urnbd/uring"
)

// The server runs to completion, one loop per CPU, as the client does: a
// thread pinned to its CPU owns an io_uring in which it waits on the
// completion channels of the connections given to it (conn.armWait, made
// anew after each wake-up), takes their requests off the CQ, serves them
// (a synchronous backend completes on this thread) and posts the answers
// of a batch with one ibv_post_send. A connection goes to loop cid mod
// loops. There is no goroutine per connection, no netpoller and no hop
// to another thread between a request's arrival and its answer.

// serverLoop is one CPU's loop.
type serverLoop struct {
	s     *Server
	cpu   int
	ring  *uring.Ring
	mbox  *clientq.Mailbox[loopMsg]
	conns []*serverConn // by slot; nil where free
	free  []int
	wcs   []rdma.WC
	// Backend operations in the ring (LoopSQE), by slot; the connections
	// whose answers wait for the end of the loop's batch of completions.
	backend     []*ServerIO
	backendFree []int
	batching    []*serverConn
	onCQE       func(*uring.CQE)
	onMsg       func(loopMsg)
	quit        bool
	done        chan struct{}
}

// loopMsg gives a connection to a loop (add) or takes it back (remove,
// once its path is shut); a nil conn ends the loop.
type loopMsg struct {
	sc  *serverConn
	add bool
}

// User data of a loop's ring entries: kind in bits 56..59, slot below.
const (
	udSrvPoll    = 1 << 56
	udSrvCancel  = 2 << 56
	udSrvWake    = 3 << 56
	udSrvBackend = 4 << 56
	udSrvEvRead  = 5 << 56 // the READ of a completion event before a wait: see conn.armWait
	udSrvKind    = 0xf << 56
)

// startLoops starts one loop per CPU the process may run on.
func (s *Server) startLoops() error {
	var set unix.CPUSet
	cpus := []int{}
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		for c := 0; c < 1024 && len(cpus) < set.Count(); c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
	}
	if len(cpus) == 0 {
		cpus = []int{-1} // unpinned
	}
	for _, cpu := range cpus {
		l, err := s.newLoop(cpu)
		if err != nil {
			s.stopLoops()
			return err
		}
		s.loops = append(s.loops, l)
	}
	return nil
}

func (s *Server) newLoop(cpu int) (*serverLoop, error) {
	mbox, err := clientq.NewMailbox[loopMsg]()
	if err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr server loop: %w", err)
	}
	l := &serverLoop{s: s, cpu: cpu, mbox: mbox, wcs: make([]rdma.WC, pollBatch), done: make(chan struct{})}
	l.onCQE, l.onMsg = l.handleCQE, l.handleMsg
	ready := make(chan error, 1)
	go l.run(ready)
	if err := <-ready; err != nil {
		mbox.Close()
		return nil, err
	}
	return l, nil
}

// stopLoops ends the loops; every connection was taken back before.
func (s *Server) stopLoops() {
	for _, l := range s.loops {
		l.mbox.Post(loopMsg{})
	}
	for _, l := range s.loops {
		<-l.done
		l.mbox.Close()
	}
	s.loops = nil
}

// loopOf returns the loop that polls connection cid.
func (s *Server) loopOf(cid uint16) *serverLoop { return s.loops[int(cid)%len(s.loops)] }

// run is the loop's thread.
func (l *serverLoop) run(ready chan<- error) {
	defer close(l.done)
	runtime.LockOSThread()
	// The thread stays locked: it exits with the goroutine rather than
	// going back to the scheduler with a narrowed CPU affinity.
	defer procs.AddBlockingThread()() // the loop sleeps in io_uring_enter holding a P
	if l.cpu >= 0 {
		var set unix.CPUSet
		set.Set(l.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			ready <- fmt.Errorf("rtrs/rdmatr server loop: pin to CPU %d: %w", l.cpu, err)
			return
		}
	}
	ring, err := uring.NewLoop(256)
	if err != nil {
		ready <- fmt.Errorf("rtrs/rdmatr server loop: %w", err)
		return
	}
	defer ring.Close()
	l.ring = ring
	l.armWake()
	ready <- nil
	var y procs.Yielder
	for !l.quit || l.busy() {
		y.Tick()
		if _, err := ring.SubmitAndWait(1); err != nil && !errors.Is(err, unix.EINTR) {
			// The ring is broken: nothing can be polled any more. Let
			// go of every connection (their paths close on their own,
			// by heartbeat) and end.
			l.s.logf("loop on CPU %d: %v", l.cpu, err)
			for _, sc := range l.conns {
				if sc != nil {
					if sc.pollOn {
						sc.c.dropWait()
					}
					l.release(sc)
				}
			}
			l.mbox.Drain(func(m loopMsg) {
				if m.sc != nil && m.add {
					m.sc.wg.Done()
				}
			})
			return
		}
		ring.ForEachCQE(l.onCQE)
		l.endBatch()
	}
}

// busy reports whether ring entries still refer to connections or
// requests.
func (l *serverLoop) busy() bool {
	if len(l.backendFree) != len(l.backend) {
		return true
	}
	for _, sc := range l.conns {
		if sc != nil {
			return true
		}
	}
	return false
}

// beginBatch has sc's answers wait in its send batch until the loop's
// batch of completions ends (endBatch).
func (l *serverLoop) beginBatch(sc *serverConn) {
	if !sc.batching {
		sc.batching = true
		sc.setPolling(true)
		l.batching = append(l.batching, sc)
	}
}

// endBatch posts the answers gathered during the loop's batch of
// completions, one ibv_post_send per connection.
func (l *serverLoop) endBatch() {
	for i, sc := range l.batching {
		l.batching[i] = nil
		sc.batching = false
		if err := sc.setPolling(false); err != nil {
			sc.p.sess.s.logf("path %v: posting answers: %v", sc.local, err)
			go sc.p.sess.s.closePath(sc.p)
		}
	}
	l.batching = l.batching[:0]
}

// BackendDone is called on the server loop's thread with the result (a
// CQE's res) of the backend operation that a handler prepared for io
// (ServerIO.LoopSQE). It usually completes io.
type BackendDone func(io *ServerIO, res int32)

// LoopSQE gives the handler, while it runs on a server loop (HandleIO
// called from the loop), a free entry of the loop's io_uring and the user
// data to prepare it with, for a backend operation that runs there: it is
// submitted with the loop's next wait, and done is called on the loop's
// thread with its result; the answers done completes go out with the rest
// of the loop's batch. done must be made once (a method value), not per
// request. ok is false off the loop (a request that waited for its chunk
// starts on a goroutine of its own): then do the I/O another way.
func (io *ServerIO) LoopSQE(done BackendDone) (sqe *uring.SQE, userData uint64, ok bool) {
	if !io.onLoop {
		return nil, 0, false
	}
	l := io.sc.loop
	if len(l.backendFree) == 0 {
		l.backendFree = append(l.backendFree, len(l.backend))
		l.backend = append(l.backend, nil)
	}
	slot := l.backendFree[len(l.backendFree)-1]
	l.backendFree = l.backendFree[:len(l.backendFree)-1]
	l.backend[slot] = io
	io.bkDone = done
	return l.sqe(), udSrvBackend | uint64(slot), true
}

// backendDone ends the backend operation in slot.
func (l *serverLoop) backendDone(slot int, res int32) {
	io := l.backend[slot]
	l.backend[slot] = nil
	l.backendFree = append(l.backendFree, slot)
	done := io.bkDone
	io.bkDone = nil
	l.beginBatch(io.sc)
	done(io, res)
}

func (l *serverLoop) sqe() *uring.SQE {
	s, err := l.ring.NextSQE()
	if err != nil {
		panic(fmt.Sprintf("rtrs/rdmatr server loop: submit: %v", err))
	}
	return s
}

func (l *serverLoop) armWake() {
	l.sqe().PrepPollAdd(int32(l.mbox.Fd()), unix.POLLIN, false, udSrvWake)
}

func (l *serverLoop) armPoll(sc *serverConn) {
	sc.pollOn = true
	if err := sc.c.armWait(l.ring, udSrvEvRead|uint64(sc.loopSlot), udSrvPoll|uint64(sc.loopSlot)); err != nil {
		panic(fmt.Sprintf("rtrs/rdmatr server loop: submit: %v", err))
	}
}

func (l *serverLoop) handleCQE(cqe *uring.CQE) {
	switch cqe.UserData & udSrvKind {
	case udSrvWake:
		l.mbox.Drain(l.onMsg)
		if !l.quit {
			l.armWake()
		}
	case udSrvBackend:
		if slot := int(uint32(cqe.UserData)); slot < len(l.backend) && l.backend[slot] != nil {
			l.backendDone(slot, cqe.Res)
		}
	case udSrvEvRead:
		// It failed (conn.armWait); the wait's POLL_ADD, after it in
		// the ring, is still to complete.
		if sc := l.connOf(cqe.UserData); sc != nil && !sc.removing && !sc.stopped() {
			if err := sc.c.readFailed(cqe.Res); err != nil {
				sc.closeFor(err)
			}
		}
	case udSrvPoll:
		sc := l.connOf(cqe.UserData)
		if sc == nil {
			return
		}
		sc.pollOn = false
		err := sc.c.endWait(cqe.Res)
		if sc.removing || sc.stopped() {
			l.release(sc)
			return
		}
		if err != nil {
			sc.closeFor(err)
			return // its remove message lets the connection go
		}
		if !sc.serveBatch() {
			// The path closes (serveBatch started it): its remove
			// message lets the connection go.
			return
		}
		l.armPoll(sc)
	}
}

// connOf returns the connection in the slot of a ring entry's user data,
// or nil.
func (l *serverLoop) connOf(userData uint64) *serverConn {
	if slot := int(uint32(userData)); slot < len(l.conns) {
		return l.conns[slot]
	}
	return nil
}

func (l *serverLoop) handleMsg(m loopMsg) {
	sc := m.sc
	switch {
	case sc == nil:
		l.quit = true
	case m.add:
		if len(l.free) == 0 {
			l.free = append(l.free, len(l.conns))
			l.conns = append(l.conns, nil)
		}
		sc.loopSlot = l.free[len(l.free)-1]
		l.free = l.free[:len(l.free)-1]
		l.conns[sc.loopSlot] = sc
		sc.inLoop = true
		if sc.stopped() {
			l.release(sc)
			return
		}
		l.armPoll(sc)
	default: // remove
		if !sc.inLoop {
			return // not added yet: the add sees the connection stopped
		}
		sc.removing = true
		if sc.pollOn {
			l.sqe().PrepPollRemove(udSrvPoll|uint64(sc.loopSlot), udSrvCancel)
			return // released when the wait ends
		}
		l.release(sc)
	}
}

// release lets go of a connection that no ring entry refers to any more:
// freePath may free it.
func (l *serverLoop) release(sc *serverConn) {
	if !sc.inLoop {
		return
	}
	sc.inLoop = false
	l.conns[sc.loopSlot] = nil
	l.free = append(l.free, sc.loopSlot)
	sc.wg.Done()
}
