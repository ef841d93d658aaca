package clientq

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Mailbox carries control messages (a path came up or went down, a
// policy change, ...) from any goroutine to the thread of one client
// queue. Posting writes an eventfd that the queue's event loop polls;
// the loop then drains the messages on its own thread. It is for control
// events, not for each request: Post takes a mutex and makes a system
// call.
type Mailbox[M any] struct {
	fd      int
	readBuf [8]byte
	mu      sync.Mutex // guards msgs and closed
	msgs    []M
	spare   []M // the slice drained last, reused to avoid allocating
	closed  bool
}

// NewMailbox returns an empty mailbox with its eventfd.
func NewMailbox[M any]() (*Mailbox[M], error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("mailbox eventfd: %w", err)
	}
	return &Mailbox[M]{fd: fd}, nil
}

// Fd returns the eventfd that becomes readable when messages are posted.
func (b *Mailbox[M]) Fd() int { return b.fd }

// Post queues m and wakes the receiving thread. Messages posted after
// Close are dropped.
func (b *Mailbox[M]) Post(m M) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.msgs = append(b.msgs, m)
	one := [8]byte{1}
	// Under the lock, so that Close cannot close the fd under the write.
	// The write cannot fail short of a closed fd: the counter saturates
	// far beyond what control events reach.
	_, _ = unix.Write(b.fd, one[:])
	b.mu.Unlock()
}

// Replace is Post that first takes out the messages not yet drained for
// which stale returns true, and hands each to drop (after the mailbox's
// lock is released): for a message that supersedes earlier ones, which a
// receiver that drains late (or never) would otherwise pile up. After
// Close, m itself goes to drop.
func (b *Mailbox[M]) Replace(m M, stale func(M) bool, drop func(M)) {
	var dropped []M
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		drop(m)
		return
	}
	kept := b.msgs[:0]
	for _, old := range b.msgs {
		if stale(old) {
			dropped = append(dropped, old)
		} else {
			kept = append(kept, old)
		}
	}
	var zero M
	for i := len(kept); i < len(b.msgs); i++ {
		b.msgs[i] = zero
	}
	b.msgs = append(kept, m)
	one := [8]byte{1}
	_, _ = unix.Write(b.fd, one[:])
	b.mu.Unlock()
	for _, old := range dropped {
		drop(old)
	}
}

// Drain resets the eventfd and calls fn, on the calling (receiving)
// thread, for every message posted since the last Drain, in order.
// Messages fn posts are kept for the next Drain.
func (b *Mailbox[M]) Drain(fn func(M)) {
	_, _ = unix.Read(b.fd, b.readBuf[:]) // EAGAIN just means nothing new
	b.mu.Lock()
	msgs := b.msgs
	b.msgs = b.spare[:0]
	b.mu.Unlock()
	for i := range msgs {
		fn(msgs[i])
		var zero M
		msgs[i] = zero // drop references to paths and closures
	}
	b.mu.Lock()
	b.spare = msgs[:0]
	b.mu.Unlock()
}

// Close closes the eventfd; later Posts are dropped. Call it once the
// receiving thread no longer polls the fd.
func (b *Mailbox[M]) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return unix.Close(b.fd)
}
