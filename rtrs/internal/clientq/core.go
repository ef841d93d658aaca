package clientq

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/procs"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/session"
	"github.com/urnbd/urnbd/uring"
)

// Conn is a transport's IO connection of one queue on one path, as the
// core sees it: a pointer to a struct that embeds ConnState.
type Conn interface {
	comparable
	PathLoad
	State() *ConnState
}

// ConnState is what the core keeps of a queue's connection. The
// transport's connection type embeds it.
type ConnState struct {
	Path *session.Path
	Gen  uint64 // the path's connect the connection belongs to
	Slot int    // its place in Core.Slots: the path's index
	// Dead: the connection failed and carries no request any more; the
	// transport reaps it once the ring no longer refers to it.
	Dead  bool
	dirty bool // in Core's dirty list, to be flushed
}

// State returns s, for Conn.
func (s *ConnState) State() *ConnState { return s }

// Usable implements PathLoad for the policy: the path is up and this
// queue's connection on it has not failed.
func (s *ConnState) Usable() bool { return !s.Dead && s.Path.Usable() }

// Inflight implements PathLoad: the requests in flight on the path.
func (s *ConnState) Inflight() int64 { return s.Path.Inflight() }

// Latency implements PathLoad: the path's heartbeat round trip.
func (s *ConnState) Latency() int64 { return s.Path.Latency() }

// Transport is what a transport's queue gives the core: how to take a
// connection the path handed over, put a request on a connection, write
// out what was queued, fail a connection, and drive its own ring
// entries. All its methods run on the queue's thread.
type Transport[C Conn, A any] interface {
	// AttachConn takes the connection a path handed over (Core.PostAttach).
	AttachConn(a A)
	// Send puts r, holding permit, on c: encodes it, queues it for the
	// next flush, and calls Core.Queued (see Carrier.Send).
	Send(r *rtrs.Request, permit int, c C) error
	// FlushConn writes out what Send queued on c, which is not dead.
	FlushConn(c C)
	// Fail takes c out of service (see Core.Hold and Core.FailOver).
	Fail(c C, why string)
	// Unfence lets the requests of c, held by Core.Hold, go again.
	Unfence(c C)
	// HandleCQE handles the completion of one of the transport's ring
	// entries: any kind but UDWake.
	HandleCQE(cqe *uring.CQE)
	// AttachRing is the queue's Attach; it returns false if the client is
	// closed, and then Run returns at once.
	AttachRing(ring *uring.Ring, base uint64) bool
	// Detach is the queue's Detach.
	Detach()
	// Busy reports whether entries in the ring still refer to
	// connections: Run goes on until they ended, even once closed.
	Busy() bool
}

// Ring entries' user data: the kind in bits 56..59, for the transport a
// slot below. The core owns UDWake; transports pick other kinds.
const (
	UDWake = 3 << 56
	UDKind = 0xf << 56
)

type msgKind uint8

const (
	msgAttach msgKind = iota
	msgDetach
	msgRetry
	msgPolicy
	msgClose
	msgDo
	msgFenced
)

// msg is a control message to a queue; A is the transport's payload of
// an attach.
type msg[A any] struct {
	kind   msgKind
	path   *session.Path // msgDetach, msgFenced
	gen    uint64        // msgDetach: that connect's; msgFenced: the newest connect fenced
	policy rtrs.MPPolicy
	do     func()
	attach A
}

// Core is the transport-neutral skeleton of a client's per-CPU queue:
// its connections by path, its requests (RequestQueue), the policy that
// picks a path, the mailbox through which the session's control messages
// reach the queue's thread, the connections held back until their path
// is fenced, and the event loop. The transport's queue holds a Core and
// gives it a Transport.
type Core[C Conn, A any] struct {
	ID     int
	Ring   *uring.Ring
	UDBase uint64
	Slots  []C // by path index; zero where the path has no connection here
	Reqs   *RequestQueue[C]

	name     string // for errors
	sess     *session.Session
	t        Transport[C, A]
	policy   rtrs.MPPolicy
	rr       int
	unheld   bool // the admin queue: sends while the session's IO is held
	dirty    []C  // connections with requests to write at Flush
	unfenced Unfenced[C]
	mbox     *Mailbox[msg[A]]
	onCQE    func(*uring.CQE)
	onMsg    func(msg[A])
}

// Init makes c queue id of set for session s; name prefixes its errors.
func (c *Core[C, A]) Init(name string, s *session.Session, set *QueueSet, id int, t Transport[C, A]) error {
	mbox, err := NewMailbox[msg[A]]()
	if err != nil {
		return fmt.Errorf("%s client queue %d: %w", name, id, err)
	}
	*c = Core[C, A]{ID: id, name: name, sess: s, t: t, policy: s.API().Policy(), mbox: mbox}
	c.Reqs = NewRequestQueue(set, id, carrier[C, A]{c})
	c.onCQE = c.HandleCQE
	c.onMsg = c.handleMsg
	return nil
}

// SetAdmin makes the queue the session's admin queue: it sends while the
// session's IO is held and may take the permits kept for it.
func (c *Core[C, A]) SetAdmin() {
	c.unheld = true
	c.Reqs.SetAdmin()
}

// carrier is the core's half of its RequestQueue's Carrier.
type carrier[C Conn, A any] struct{ c *Core[C, A] }

func (k carrier[C, A]) Pick(skip int) (C, bool) {
	c := k.c
	var zero C
	if !c.unheld && c.sess.Link().Held() {
		return zero, false // ResumeIO wakes the queue
	}
	i := Select(c.policy, c.Slots, &c.rr, skip)
	if i < 0 {
		return zero, false
	}
	return c.Slots[i], true
}

func (k carrier[C, A]) Send(r *rtrs.Request, permit int, qc C) error {
	return k.c.t.Send(r, permit, qc)
}

func (k carrier[C, A]) Wake()      { k.c.mbox.Post(msg[A]{kind: msgRetry}) }
func (k carrier[C, A]) Hope() bool { return k.c.sess.AnyHope() }

// Queued counts a request that Send put on qc in flight on its path and
// has qc flushed at the next Flush.
func (c *Core[C, A]) Queued(qc C) {
	s := qc.State()
	s.Path.Stats().IncInflight()
	c.MarkDirty(qc)
}

// MarkDirty has qc flushed at the next Flush.
func (c *Core[C, A]) MarkDirty(qc C) {
	if s := qc.State(); !s.dirty {
		s.dirty = true
		c.dirty = append(c.dirty, qc)
	}
}

// Flush writes out the requests queued since the last Flush, connection
// by connection. The event loop that drives the queue calls it after each
// batch of completions (Run does).
func (c *Core[C, A]) Flush() {
	// A failed write fails requests over, which may queue more
	// connections here: take them from the end until none is left.
	var zero C
	for n := len(c.dirty); n > 0; n = len(c.dirty) {
		qc := c.dirty[n-1]
		c.dirty[n-1] = zero
		c.dirty = c.dirty[:n-1]
		s := qc.State()
		s.dirty = false
		if !s.Dead {
			c.t.FlushConn(qc)
		}
	}
}

// Run runs the queue's event loop on the calling goroutine, locked to its
// OS thread, with its own io_uring: start is called once on the thread
// before the loop; Run returns when the client is closed.
func (c *Core[C, A]) Run(start func()) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer procs.AddBlockingThread()() // the loop sleeps in io_uring_enter holding a P
	ring, err := uring.NewLoop(256)
	if err != nil {
		return fmt.Errorf("%s client queue %d: %w", c.name, c.ID, err)
	}
	defer ring.Close()
	if !c.t.AttachRing(ring, 0) {
		return nil // the client was closed before the queue ran
	}
	defer c.t.Detach()
	if start != nil {
		start()
	}
	var y procs.Yielder
	for !c.Reqs.Closed() || c.t.Busy() {
		y.Tick()
		c.Flush()
		if _, err := ring.SubmitAndWait(1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("%s client queue %d: %w", c.name, c.ID, err)
		}
		ring.ForEachCQE(c.onCQE)
	}
	return nil
}

// SetRing makes the queue submit to ring, its entries' user data marked
// with base, and polls its mailbox there.
func (c *Core[C, A]) SetRing(ring *uring.Ring, base uint64) {
	c.Ring, c.UDBase = ring, base
	if ring != nil {
		c.armWake()
	}
}

// SQE returns a free entry of the queue's ring, submitting the ring's
// entries to make room if it is full.
func (c *Core[C, A]) SQE() *uring.SQE {
	s, err := c.Ring.NextSQE()
	if err != nil {
		panic(fmt.Sprintf("%s client queue %d: submit: %v", c.name, c.ID, err))
	}
	return s
}

func (c *Core[C, A]) armWake() {
	c.SQE().PrepPollAdd(int32(c.mbox.Fd()), unix.POLLIN, false, c.UDBase|UDWake)
}

// HandleCQE handles a completion of one of the queue's ring entries.
func (c *Core[C, A]) HandleCQE(cqe *uring.CQE) {
	if cqe.UserData&UDKind != UDWake {
		c.t.HandleCQE(cqe)
		return
	}
	c.mbox.Drain(c.onMsg)
	c.Reqs.RetryWaiting()
	if !c.Reqs.Closed() {
		c.armWake()
	}
}

// SlotConn returns the connection of the slot in a ring entry's user
// data, or zero.
func (c *Core[C, A]) SlotConn(ud uint64) C {
	if slot := int(uint32(ud)); slot < len(c.Slots) {
		return c.Slots[slot]
	}
	var zero C
	return zero
}

// SetSlot puts qc in its slot, growing the slots as needed, and returns
// the connection it replaces (zero if none).
func (c *Core[C, A]) SetSlot(qc C) (old C) {
	idx := qc.State().Slot
	for len(c.Slots) <= idx {
		var zero C
		c.Slots = append(c.Slots, zero)
	}
	old, c.Slots[idx] = c.Slots[idx], qc
	return old
}

// ClearSlot empties qc's slot if qc is still in it.
func (c *Core[C, A]) ClearSlot(qc C) {
	if s := qc.State().Slot; s < len(c.Slots) && c.Slots[s] == qc {
		var zero C
		c.Slots[s] = zero
	}
}

// Do and the Post methods may be called from any goroutine: they hand a
// message to the queue's thread through its mailbox.

// Do runs fn on the queue's thread, soon. It is for control work, not for
// each request.
func (c *Core[C, A]) Do(fn func()) { c.mbox.Post(msg[A]{kind: msgDo, do: fn}) }

// PostAttach hands the queue a connection of path p (the transport's a).
func (c *Core[C, A]) PostAttach(a A) { c.mbox.Post(msg[A]{kind: msgAttach, attach: a}) }

// ReplaceAttach hands the queue a connection like PostAttach, first
// dropping (drop) the ones handed over before and not taken yet for which
// stale is true.
func (c *Core[C, A]) ReplaceAttach(a A, stale func(A) bool, drop func(A)) {
	c.mbox.Replace(msg[A]{kind: msgAttach, attach: a},
		func(old msg[A]) bool { return old.kind == msgAttach && stale(old.attach) },
		func(old msg[A]) { drop(old.attach) })
}

// PostDetach takes the connection of connect gen of path p from the
// queue: it fails, its requests fail over.
func (c *Core[C, A]) PostDetach(p *session.Path, gen uint64) {
	c.mbox.Post(msg[A]{kind: msgDetach, path: p, gen: gen})
}

// PostRetry has the queue retry its waiting requests.
func (c *Core[C, A]) PostRetry() { c.mbox.Post(msg[A]{kind: msgRetry}) }

// PostFenced tells the queue that the server closed path p's connects up
// to gen: the requests held for them may go again.
func (c *Core[C, A]) PostFenced(p *session.Path, gen uint64) {
	c.mbox.Post(msg[A]{kind: msgFenced, path: p, gen: gen})
}

// PostPolicy sets the queue's multipath policy.
func (c *Core[C, A]) PostPolicy(p rtrs.MPPolicy) { c.mbox.Post(msg[A]{kind: msgPolicy, policy: p}) }

// PostClose closes the queue: its connections fail, its requests end.
func (c *Core[C, A]) PostClose() { c.mbox.Post(msg[A]{kind: msgClose}) }

// CloseMailbox drains the mailbox, handing the connections handed over
// and never taken to drop, and closes it: for a queue that no loop drives.
func (c *Core[C, A]) CloseMailbox(drop func(A)) {
	c.mbox.Drain(func(m msg[A]) {
		if m.kind == msgAttach && drop != nil {
			drop(m.attach)
		}
	})
	c.mbox.Close()
}

// handleMsg handles a control message on the queue's thread.
func (c *Core[C, A]) handleMsg(m msg[A]) {
	var zero C
	switch m.kind {
	case msgAttach:
		c.t.AttachConn(m.attach)
	case msgDetach:
		if i := m.path.Index(); i < len(c.Slots) {
			if qc := c.Slots[i]; qc != zero && qc.State().Path == m.path && qc.State().Gen == m.gen {
				c.t.Fail(qc, "detached")
			}
		}
	case msgPolicy:
		c.policy = m.policy
	case msgDo:
		m.do()
	case msgClose:
		c.Reqs.Close()
		for _, qc := range c.Slots {
			if qc != zero {
				c.t.Fail(qc, "client closed")
			}
		}
		c.releaseUnfenced(func(C) bool { return true })
	case msgFenced:
		c.releaseUnfenced(func(qc C) bool { s := qc.State(); return s.Path == m.path && s.Gen <= m.gen })
	}
	if c.unfenced.Len() > 0 && !c.sess.AnyHope() {
		// No path will carry them again: they fail over to nothing and
		// end with -ENOTCONN.
		c.releaseUnfenced(func(C) bool { return true })
	}
}

// Hold keeps a dead connection's requests from going again if the server
// may still have them unread: it fences, and has not closed the
// connection's connect yet. It reports whether it held them; the
// transport then calls nothing more until Unfence.
func (c *Core[C, A]) Hold(qc C) bool {
	s := qc.State()
	if !c.sess.Fencing() || c.Reqs.Closed() || s.Gen <= s.Path.FencedGen() {
		return false
	}
	c.unfenced.Hold(qc)
	return true
}

// FailOver moves the requests of qc, which failed, to another path.
func (c *Core[C, A]) FailOver(qc C) {
	s := qc.State()
	c.Reqs.FailOver(qc, s.Slot, s.Path.Stats())
}

// releaseUnfenced lets the requests of the held connections that match
// go again.
func (c *Core[C, A]) releaseUnfenced(match func(C) bool) {
	c.unfenced.Release(match, c.t.Unfence)
}
