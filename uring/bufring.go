package uring

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A BufRing is a ring of provided buffers (IORING_REGISTER_PBUF_RING, Linux
// 5.19): the application lends buffers to the kernel by writing entries
// and advancing the ring's tail; a request with SQEBufferSelect and the
// ring's group in SQE.BufIndex takes one when it has data to deliver, and
// its CQE carries CQEFBuffer and the buffer's ID (CQE.BufferID). The buffer
// is the application's again once that CQE is reaped, to read and then to
// Add back.
//
// Like its Ring, a BufRing belongs to one thread.
type BufRing struct {
	ring    *Ring
	mem     []byte // the entries, shared with the kernel
	entries []bufRingEntry
	mask    uint16
	tail    uint16 // this side's tail: entries added, published by Advance
	group   uint16
}

// bufRingEntry mirrors struct io_uring_buf. The kernel reads the ring's
// tail from the last 16 bits of entry 0 (struct io_uring_buf_ring overlays
// its tail on entry 0's resv).
type bufRingEntry struct {
	addr uint64
	len  uint32
	bid  uint16
	_    uint16
}

// bufReg mirrors struct io_uring_buf_reg.
type bufReg struct {
	ringAddr    uint64
	ringEntries uint32
	bgid        uint16
	flags       uint16
	_           [3]uint64
}

// RegisterBufRing registers an empty ring of entries provided buffers (a
// power of two up to 32768) as buffer group group.
func (r *Ring) RegisterBufRing(entries uint32, group uint16) (*BufRing, error) {
	if entries == 0 || entries > 1<<15 || entries&(entries-1) != 0 {
		return nil, fmt.Errorf("buffer ring of %d entries: want a power of two up to 32768: %w", entries, unix.EINVAL)
	}
	size := int(entries) * int(unsafe.Sizeof(bufRingEntry{}))
	page := unix.Getpagesize()
	size = (size + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("buffer ring: mmap %d bytes: %w", size, err)
	}
	reg := bufReg{ringAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), ringEntries: entries, bgid: group}
	err = r.Register(RegPbufRing, unsafe.Pointer(&reg), 1)
	runtime.KeepAlive(&reg)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("register buffer ring (group %d): %w", group, err)
	}
	return &BufRing{
		ring:    r,
		mem:     mem,
		entries: unsafe.Slice((*bufRingEntry)(unsafe.Pointer(&mem[0])), entries),
		mask:    uint16(entries - 1),
		group:   group,
	}, nil
}

// Group returns the ring's buffer group, for SQE.BufIndex.
func (b *BufRing) Group() uint16 { return b.group }

// Add queues buf, n bytes, as buffer bid; the kernel sees it after Advance.
// The memory must stay valid while the kernel may use it: mmap memory, or
// Go memory kept reachable until the ring is closed.
func (b *BufRing) Add(buf unsafe.Pointer, n uint32, bid uint16) {
	i := b.tail & b.mask
	e := &b.entries[i]
	e.addr = addr(buf)
	e.len = n
	if i == 0 {
		// Entry 0's bid shares a 32-bit word with the published tail;
		// write it through that word, as Advance does, so the two stores
		// never tear each other.
		b.storeWord0(bid, b.published())
	} else {
		e.bid = bid
	}
	b.tail++
}

// Advance publishes the buffers added since the last Advance.
func (b *BufRing) Advance() { b.storeWord0(b.entries[0].bid, b.tail) }

// tailWord is the 32-bit word at offset 12 of the ring: entry 0's bid and
// the ring's tail.
func (b *BufRing) tailWord() *uint32 { return (*uint32)(unsafe.Pointer(&b.mem[12])) }

func (b *BufRing) published() uint16 {
	w := atomic.LoadUint32(b.tailWord())
	if bigEndian {
		return uint16(w)
	}
	return uint16(w >> 16)
}

// storeWord0 stores entry 0's bid and the tail with one atomic release
// store: every entry written before it is visible to the kernel when it
// reads the tail.
func (b *BufRing) storeWord0(bid0, tail uint16) {
	w := uint32(bid0) | uint32(tail)<<16
	if bigEndian {
		w = uint32(bid0)<<16 | uint32(tail)
	}
	atomic.StoreUint32(b.tailWord(), w)
}

// Close unregisters the ring and frees its entries (not the buffers, which
// are the caller's). Requests that may still pick buffers from it must have
// completed.
func (b *BufRing) Close() error {
	if b.mem == nil {
		return nil
	}
	reg := bufReg{bgid: b.group}
	err := b.ring.Register(UnregPbufRing, unsafe.Pointer(&reg), 1)
	runtime.KeepAlive(&reg)
	if err != nil {
		err = fmt.Errorf("unregister buffer ring (group %d): %w", b.group, err)
	}
	unix.Munmap(b.mem)
	b.mem, b.entries = nil, nil
	return err
}
