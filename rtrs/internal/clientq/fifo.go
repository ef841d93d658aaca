package clientq

import "github.com/urnbd/urnbd/rtrs"

// waiter is a request that waits for a permit or a usable path, with what
// the queue knows of it.
type waiter struct {
	r      *rtrs.Request
	permit int32 // -1 until it has one: a request failed over keeps its own
	start  int64 // nanotime at Submit
}

// fifo is a queue of waiters in a ring buffer that grows by doubling and
// never shrinks: once it has held the most requests that ever waited,
// pushing allocates nothing.
type fifo struct {
	buf  []waiter
	head int
	n    int
}

func (f *fifo) len() int { return f.n }

func (f *fifo) grow() {
	if f.n < len(f.buf) {
		return
	}
	buf := make([]waiter, max(16, 2*len(f.buf)))
	for i := 0; i < f.n; i++ {
		buf[i] = f.buf[(f.head+i)%len(f.buf)]
	}
	f.buf, f.head = buf, 0
}

func (f *fifo) push(w waiter) {
	f.grow()
	f.buf[(f.head+f.n)%len(f.buf)] = w
	f.n++
}

func (f *fifo) pushFront(w waiter) {
	f.grow()
	f.head = (f.head + len(f.buf) - 1) % len(f.buf)
	f.buf[f.head] = w
	f.n++
}

// pop takes the first waiter; the fifo must not be empty.
func (f *fifo) pop() waiter {
	w := f.buf[f.head]
	f.buf[f.head] = waiter{}
	f.head = (f.head + 1) % len(f.buf)
	f.n--
	return w
}
