package uring

import (
	"sync/atomic"
	"unsafe"
)

// GetSQE returns the next free submission queue entry, zeroed over its whole
// size (64 or 128 bytes), or nil when the submission queue is full; the
// caller then submits and retries. The entry belongs to the caller until it
// is submitted. On an SQE128 ring the result is the first half of a 128-byte
// entry; use GetSQE128 to reach the rest.
//
// GetSQE does not allocate and makes no system call.
func (r *Ring) GetSQE() *SQE {
	p := r.nextSQE()
	if p == nil {
		return nil
	}
	return (*SQE)(p)
}

// GetSQE128 is GetSQE for rings created with SetupSQE128. It panics on a ring
// with 64-byte entries, where the extra 64 bytes do not exist.
func (r *Ring) GetSQE128() *SQE128 {
	if r.sqeShift != 7 {
		panic("uring: GetSQE128 on a ring without SetupSQE128")
	}
	p := r.nextSQE()
	if p == nil {
		return nil
	}
	return (*SQE128)(p)
}

// nextSQE claims and zeroes the entry at the local tail.
func (r *Ring) nextSQE() unsafe.Pointer {
	// The kernel advances the head as it consumes entries (in
	// io_uring_enter, or at any time with SQPOLL); the load orders our
	// reuse of the slot after the kernel is done reading it.
	head := atomic.LoadUint32(r.sqHead)
	tail := r.sqeTail
	if tail-head >= r.sqEntries {
		return nil
	}
	p := unsafe.Add(r.sqes, uintptr(tail&r.sqMask)<<r.sqeShift)
	if r.sqeShift == 7 {
		*(*[128]byte)(p) = [128]byte{}
	} else {
		*(*[64]byte)(p) = [64]byte{}
	}
	r.sqeTail = tail + 1
	return p
}

// Pending returns the number of SQEs obtained from GetSQE that the kernel
// has not consumed yet: those not submitted, plus any that a previous
// submission left over (for example when the kernel stopped early).
func (r *Ring) Pending() uint32 {
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// SQSpace returns the number of entries GetSQE can hand out before the
// submission queue is full.
func (r *Ring) SQSpace() uint32 {
	return r.sqEntries - r.Pending()
}

// flushSQ publishes the SQEs handed out since the last flush by storing the
// local tail to the shared tail, and returns how many entries the kernel has
// yet to consume. The SQEs were written before this store (and the index
// array at setup), so the kernel sees them complete once it loads the tail.
func (r *Ring) flushSQ() uint32 {
	if r.sqeTail != r.sqTailPub {
		r.sqTailPub = r.sqeTail
		atomic.StoreUint32(r.sqTail, r.sqeTail)
	}
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}
