package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ring is an io_uring instance: the ring file descriptor and the shared
// submission and completion queues mapped into this process.
//
// A Ring is not safe for concurrent use. Create it with New or
// NewWithParams and release it with Close; the zero Ring is not usable.
type Ring struct {
	fd       int
	flags    uint32 // setup flags as accepted by the kernel
	features uint32

	// Submission queue. The kernel consumes entries and advances *sqHead;
	// we produce entries and publish them by advancing *sqTail.
	sqHead    *uint32
	sqTail    *uint32
	sqFlags   *uint32
	sqDropped *uint32
	sqMask    uint32
	sqEntries uint32
	sqes      unsafe.Pointer // SQE array base
	sqeShift  uint           // log2 of the SQE size: 6 or 7 (SetupSQE128)
	sqeTail   uint32         // local tail: one past the last SQE handed out
	sqTailPub uint32         // last value stored to *sqTail

	// Completion queue. The kernel produces entries and advances *cqTail;
	// we consume them and advance *cqHead.
	cqHead     *uint32
	cqTail     *uint32
	cqOverflow *uint32
	cqMask     uint32
	cqEntries  uint32
	cqes       unsafe.Pointer // CQE array base
	cqeShift   uint           // log2 of the CQE size: 4 or 5 (SetupCQE32)
	cqHeadLoc  uint32         // local copy of *cqHead; we are its only writer

	// getevents is the IORING_ENTER_EXT_ARG argument of WaitCQETimeout,
	// kept here so that waiting with a timeout does not allocate.
	getevents getEventsArg
	waitTS    KernelTimespec

	// Mappings. cqMap is nil when the kernel maps both rings at once
	// (FeatSingleMmap) and sqMap covers the CQ ring too.
	sqMap, cqMap, sqeMap []byte
}

// getEventsArg mirrors struct io_uring_getevents_arg.
type getEventsArg struct {
	sigmask     uint64
	sigmaskSz   uint32
	minWaitUsec uint32
	ts          uint64
}

// New creates a ring with room for at least entries submissions (the kernel
// rounds up to a power of two) and the given Setup* flags.
func New(entries uint32, flags uint32) (*Ring, error) {
	p := Params{Flags: flags}
	return NewWithParams(entries, &p)
}

// NewWithParams creates a ring from p, which the kernel fills in: on return
// p holds the real queue sizes, features and ring offsets. A nil p is the
// same as New(entries, 0).
//
// SetupNoMmap and SetupRegisteredFdOnly are refused: this package maps the
// rings itself and needs a real ring file descriptor. SetupNoSQArray is
// supported.
func NewWithParams(entries uint32, p *Params) (*Ring, error) {
	if p == nil {
		p = new(Params)
	}
	if bad := p.Flags & (SetupNoMmap | SetupRegisteredFdOnly); bad != 0 {
		return nil, fmt.Errorf("io_uring_setup: setup flags %#x not supported by package uring: %w", bad, unix.EINVAL)
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), flags: p.Flags, features: p.Features}
	if err := r.mapRings(p); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// mapRings maps the SQ ring, the CQ ring (unless FeatSingleMmap puts both in
// one mapping) and the SQE array, and points the ring fields into them.
func (r *Ring) mapRings(p *Params) error {
	r.sqeShift = 6 // 64-byte SQEs
	if p.Flags&SetupSQE128 != 0 {
		r.sqeShift = 7
	}
	r.cqeShift = 4 // 16-byte CQEs
	if p.Flags&SetupCQE32 != 0 {
		r.cqeShift = 5
	}

	// The SQ ring ends with the index array, unless there is none
	// (SetupNoSQArray, Array == 0); then it needs at least the header words.
	sqSize := uint64(p.SQOff.Array) + uint64(p.SQEntries)*4
	for _, off := range [...]uint32{p.SQOff.Head, p.SQOff.Tail, p.SQOff.RingMask, p.SQOff.RingEntries, p.SQOff.Flags, p.SQOff.Dropped} {
		sqSize = max(sqSize, uint64(off)+4)
	}
	cqSize := uint64(p.CQOff.CQEs) + uint64(p.CQEntries)<<r.cqeShift
	single := p.Features&FeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}

	var err error
	if r.sqMap, err = mmapRegion(r.fd, offSQRing, sqSize); err != nil {
		return fmt.Errorf("mmap io_uring SQ ring: %w", err)
	}
	cq := r.sqMap
	if !single {
		if r.cqMap, err = mmapRegion(r.fd, offCQRing, cqSize); err != nil {
			return fmt.Errorf("mmap io_uring CQ ring: %w", err)
		}
		cq = r.cqMap
	}
	if r.sqeMap, err = mmapRegion(r.fd, offSQEs, uint64(p.SQEntries)<<r.sqeShift); err != nil {
		return fmt.Errorf("mmap io_uring SQEs: %w", err)
	}

	sq := r.sqMap
	r.sqHead = word(sq, p.SQOff.Head)
	r.sqTail = word(sq, p.SQOff.Tail)
	r.sqFlags = word(sq, p.SQOff.Flags)
	r.sqDropped = word(sq, p.SQOff.Dropped)
	r.sqMask = *word(sq, p.SQOff.RingMask)
	r.sqEntries = *word(sq, p.SQOff.RingEntries)
	r.sqes = unsafe.Pointer(&r.sqeMap[0])

	r.cqHead = word(cq, p.CQOff.Head)
	r.cqTail = word(cq, p.CQOff.Tail)
	r.cqOverflow = word(cq, p.CQOff.Overflow)
	r.cqMask = *word(cq, p.CQOff.RingMask)
	r.cqEntries = *word(cq, p.CQOff.RingEntries)
	r.cqes = unsafe.Pointer(&cq[p.CQOff.CQEs])

	if r.sqEntries != p.SQEntries || r.cqEntries != p.CQEntries ||
		r.sqMask != r.sqEntries-1 || r.cqMask != r.cqEntries-1 {
		return fmt.Errorf("io_uring: inconsistent ring sizes (sq %d/%d mask %#x, cq %d/%d mask %#x)",
			r.sqEntries, p.SQEntries, r.sqMask, r.cqEntries, p.CQEntries, r.cqMask)
	}

	// Slot i of the SQ index array names SQE i, once and for all: the
	// array is written here, before any tail is published, and never
	// again, so publishing the tail is all a submission takes.
	if p.Flags&SetupNoSQArray == 0 {
		array := unsafe.Slice(word(sq, p.SQOff.Array), r.sqEntries)
		for i := range array {
			array[i] = uint32(i)
		}
	}

	r.sqeTail = atomic.LoadUint32(r.sqTail)
	r.sqTailPub = r.sqeTail
	r.cqHeadLoc = atomic.LoadUint32(r.cqHead)
	return nil
}

// mmapRegion maps size bytes of the ring fd at one of the IORING_OFF_*
// offsets, shared and populated.
func mmapRegion(fd int, off int64, size uint64) ([]byte, error) {
	if size == 0 || size > uint64(^uint(0)>>1) {
		return nil, fmt.Errorf("bad mapping size %d: %w", size, unix.EINVAL)
	}
	return unix.Mmap(fd, off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// word returns a pointer to the 32-bit ring field at byte offset off of a
// ring mapping.
func word(m []byte, off uint32) *uint32 {
	return (*uint32)(unsafe.Pointer(&m[off]))
}

// Close unmaps the rings and closes the ring file descriptor. It is safe to
// call more than once; later calls return nil. Any other method used after
// Close panics.
//
// Closing the ring cancels the requests still in flight, but the kernel
// finishes that asynchronously: memory those requests read or write must
// stay valid until their completions have been reaped, so reap everything
// before calling Close.
func (r *Ring) Close() error {
	if r.fd < 0 {
		return nil
	}
	var errs []error
	for _, m := range [...]*[]byte{&r.sqeMap, &r.cqMap, &r.sqMap} {
		if *m == nil {
			continue
		}
		if err := unix.Munmap(*m); err != nil {
			errs = append(errs, fmt.Errorf("munmap io_uring ring: %w", err))
		}
		*m = nil
	}
	if err := unix.Close(r.fd); err != nil {
		errs = append(errs, fmt.Errorf("close io_uring fd %d: %w", r.fd, err))
	}
	*r = Ring{fd: -1}
	return errors.Join(errs...)
}

// Fd returns the ring file descriptor, or -1 after Close.
func (r *Ring) Fd() int { return r.fd }

// Flags returns the Setup* flags the ring was created with.
func (r *Ring) Flags() uint32 { return r.flags }

// Features returns the Feat* bits the kernel reported at setup.
func (r *Ring) Features() uint32 { return r.features }

// SQEntries returns the number of submission queue entries.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }

// CQEntries returns the number of completion queue entries.
func (r *Ring) CQEntries() uint32 { return r.cqEntries }

// SQE128 reports whether the ring uses 128-byte SQEs (SetupSQE128).
func (r *Ring) SQE128() bool { return r.sqeShift == 7 }

// CQE32 reports whether the ring uses 32-byte CQEs (SetupCQE32).
func (r *Ring) CQE32() bool { return r.cqeShift == 5 }

// SQFlags returns the SQ ring flags the kernel maintains (SQNeedWakeup,
// SQCQOverflow, SQTaskrun).
func (r *Ring) SQFlags() uint32 { return atomic.LoadUint32(r.sqFlags) }

// Dropped returns the number of invalid SQEs the kernel has skipped (the
// SQ ring's dropped counter).
func (r *Ring) Dropped() uint32 { return atomic.LoadUint32(r.sqDropped) }

// CQOverflow returns the number of completions lost because the CQ ring was
// full (always 0 with FeatNodrop, where they wait in the kernel instead).
func (r *Ring) CQOverflow() uint32 { return atomic.LoadUint32(r.cqOverflow) }

// setWaitTimeout points the EXT_ARG argument at the relative timeout d
// (negative counts as zero).
func (r *Ring) setWaitTimeout(d time.Duration) unsafe.Pointer {
	r.waitTS = NsecToTimespec(max(d, 0).Nanoseconds())
	r.getevents = getEventsArg{ts: uint64(uintptr(unsafe.Pointer(&r.waitTS)))}
	return unsafe.Pointer(&r.getevents)
}
