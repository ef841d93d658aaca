package rtrs

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
