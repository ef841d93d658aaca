package uring

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CQE mirrors struct io_uring_cqe, a 16-byte completion queue entry.
//
// CQEs returned by the Ring point into the mapped completion queue. They are
// valid until the head is advanced past them (CQESeen, CQAdvance, or the end
// of ForEachCQE); after that the kernel may overwrite them.
type CQE struct {
	UserData uint64 // SQE.UserData of the request
	Res      int32  // result: >= 0 on success, -errno on failure
	Flags    uint32 // CQEF* flags
}

// CQE32 is a 32-byte completion queue entry, as posted on rings created with
// SetupCQE32: the CQE followed by 16 bytes of extra result data
// (big_cqe[2]), which URING_CMD drivers such as NVMe passthrough fill in.
type CQE32 struct {
	CQE
	big [2]uint64
}

// Big returns the extra 16 bytes of a 32-byte CQE, big_cqe[0] and [1].
func (c *CQE32) Big() [2]uint64 { return c.big }

// Err returns nil if Res is not negative, and the errno -Res otherwise. It
// does not allocate.
func (c *CQE) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return unix.Errno(-c.Res)
}

// BufferID returns the provided-buffer ID of a CQE with CQEFBuffer set.
func (c *CQE) BufferID() uint16 { return uint16(c.Flags >> CQEBufferShift) }

// CQReady returns the number of completions waiting to be reaped.
func (r *Ring) CQReady() uint32 {
	return atomic.LoadUint32(r.cqTail) - r.cqHeadLoc
}

// PeekCQE returns the completion at the head of the queue without consuming
// it, or nil if there is none. It makes no system call: with SetupIOPoll,
// SetupDeferTaskrun or a pending SQTaskrun/SQCQOverflow flag, completions
// only reach the ring when the kernel is entered (SubmitAndWait, WaitCQE).
// On a CQE32 ring the result is the first half of a 32-byte entry.
func (r *Ring) PeekCQE() *CQE {
	p := r.peek()
	if p == nil {
		return nil
	}
	return (*CQE)(p)
}

// PeekCQE32 is PeekCQE for rings created with SetupCQE32. It panics on a
// ring with 16-byte completions.
func (r *Ring) PeekCQE32() *CQE32 {
	r.mustCQE32()
	p := r.peek()
	if p == nil {
		return nil
	}
	return (*CQE32)(p)
}

func (r *Ring) mustCQE32() {
	if r.cqeShift != 5 {
		panic("uring: 32-byte CQE access on a ring without SetupCQE32")
	}
}

func (r *Ring) peek() unsafe.Pointer {
	head := r.cqHeadLoc
	// The load of the tail orders the reads of the entries after the
	// kernel's writes of them.
	if head == atomic.LoadUint32(r.cqTail) {
		return nil
	}
	return unsafe.Add(r.cqes, uintptr(head&r.cqMask)<<r.cqeShift)
}

// CQESeen consumes the completion returned by PeekCQE, advancing the head by
// one.
func (r *Ring) CQESeen() { r.CQAdvance(1) }

// CQAdvance consumes n completions. The store of the head, after the reads
// of the entries, hands their slots back to the kernel.
func (r *Ring) CQAdvance(n uint32) {
	if n == 0 {
		return
	}
	r.cqHeadLoc += n
	atomic.StoreUint32(r.cqHead, r.cqHeadLoc)
}

// ForEachCQE calls fn for every completion currently in the queue, in order,
// then consumes them all with a single head update, and returns how many it
// reaped. It makes no system call and does not allocate.
//
// fn must not keep the *CQE after it returns, and must not call PeekCQE,
// CQESeen, CQAdvance or ForEachCQE on the same ring; it may get and submit
// new SQEs. Completions that arrive while fn runs are left for the next
// call.
//
// fn does not escape, so a func literal or method value passed directly is
// not heap allocated; still, in hot loops prefer a method value created once
// (h := handler.complete; ... r.ForEachCQE(h)) over a new closure per call.
func (r *Ring) ForEachCQE(fn func(cqe *CQE)) int {
	head := r.cqHeadLoc
	tail := atomic.LoadUint32(r.cqTail)
	for i := head; i != tail; i++ {
		fn((*CQE)(unsafe.Add(r.cqes, uintptr(i&r.cqMask)<<r.cqeShift)))
	}
	n := tail - head
	r.CQAdvance(n)
	return int(n)
}

// ForEachCQE32 is ForEachCQE for rings created with SetupCQE32. It panics
// on a ring with 16-byte completions.
func (r *Ring) ForEachCQE32(fn func(cqe *CQE32)) int {
	r.mustCQE32()
	head := r.cqHeadLoc
	tail := atomic.LoadUint32(r.cqTail)
	for i := head; i != tail; i++ {
		fn((*CQE32)(unsafe.Add(r.cqes, uintptr(i&r.cqMask)<<r.cqeShift)))
	}
	n := tail - head
	r.CQAdvance(n)
	return int(n)
}
