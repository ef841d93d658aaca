package rdma

/*
#cgo noescape urnbd_post_send
#cgo nocallback urnbd_post_send
#cgo noescape urnbd_post_recv
#cgo nocallback urnbd_post_recv
#include "crdma.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// WROpcode is the operation of a send work request (enum ibv_wr_opcode).
type WROpcode uint32

// Send work request opcodes.
const (
	WRWrite        WROpcode = C.IBV_WR_RDMA_WRITE
	WRWriteWithImm WROpcode = C.IBV_WR_RDMA_WRITE_WITH_IMM
	WRSend         WROpcode = C.IBV_WR_SEND
	WRSendWithImm  WROpcode = C.IBV_WR_SEND_WITH_IMM
	WRRead         WROpcode = C.IBV_WR_RDMA_READ
	WRSendWithInv  WROpcode = C.IBV_WR_SEND_WITH_INV
)

// SendFlags are flags of a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = C.IBV_SEND_FENCE
	SendSignaled  SendFlags = C.IBV_SEND_SIGNALED
	SendSolicited SendFlags = C.IBV_SEND_SOLICITED
	SendInline    SendFlags = C.IBV_SEND_INLINE
)

// SGE is a scatter/gather element (struct ibv_sge): a range of a
// registered memory region.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request as added to a SendBatch.
type SendWR struct {
	ID     uint64 // returned in the completion's WRID
	Opcode WROpcode
	Flags  SendFlags
	// Imm is the immediate data of WRWriteWithImm and WRSendWithImm, in
	// host byte order: it is sent big-endian (htonl), as the kernel's
	// RTRS does, and the peer's WC.Imm shows the same value. For
	// WRSendWithInv it is the rkey to invalidate.
	Imm uint32
	// RemoteAddr and RKey name the peer's memory for WRWrite,
	// WRWriteWithImm and WRRead.
	RemoteAddr uint64
	RKey       uint32
}

// sendWR is struct urnbd_send_wr.
type sendWR struct {
	id         uint64
	remoteAddr uint64
	rkey       uint32
	imm        uint32
	opcode     uint32
	flags      uint32
	numSGE     uint32
	_          uint32
}

// recvWR is struct urnbd_recv_wr.
type recvWR struct {
	id     uint64
	numSGE uint32
	_      uint32
}

var (
	_ [unsafe.Sizeof(sendWR{}) - C.sizeof_struct_urnbd_send_wr]byte
	_ [C.sizeof_struct_urnbd_send_wr - unsafe.Sizeof(sendWR{})]byte
	_ [unsafe.Sizeof(recvWR{}) - C.sizeof_struct_urnbd_recv_wr]byte
	_ [C.sizeof_struct_urnbd_recv_wr - unsafe.Sizeof(recvWR{})]byte
	_ [unsafe.Sizeof(SGE{}) - C.sizeof_struct_ibv_sge]byte
	_ [C.sizeof_struct_ibv_sge - unsafe.Sizeof(SGE{})]byte
)

// Errors of batch building.
var (
	ErrBatchFull  = errors.New("rdma: work request batch is full")
	ErrTooManySGE = errors.New("rdma: too many SGEs in a work request")
	ErrEmptyBatch = errors.New("rdma: no work request to add an SGE to")
)

// batch is the C memory shared by SendBatch and RecvBatch.
type batch struct {
	mem    unsafe.Pointer // one C allocation: requests, SGEs, verbs WRs
	sge    []SGE          // maxWR*maxSGE, C memory
	wrs    unsafe.Pointer // ibv_send_wr or ibv_recv_wr array
	n      int
	maxWR  int
	maxSGE int
}

func (b *batch) init(maxWR, maxSGE int, inSize, wrSize uintptr) unsafe.Pointer {
	if maxWR < 1 {
		maxWR = 1
	}
	if maxSGE < 1 {
		maxSGE = 1
	}
	in := uintptr(maxWR) * inSize
	sg := uintptr(maxWR*maxSGE) * unsafe.Sizeof(SGE{})
	wr := uintptr(maxWR) * wrSize
	b.mem = C.calloc(1, C.size_t(in+sg+wr))
	if b.mem == nil {
		panic("rdma: out of C memory for a work request batch")
	}
	b.sge = unsafe.Slice((*SGE)(unsafe.Add(b.mem, in)), maxWR*maxSGE)
	b.wrs = unsafe.Add(b.mem, in+sg)
	b.maxWR, b.maxSGE = maxWR, maxSGE
	return b.mem
}

func (b *batch) free() {
	if b.mem != nil {
		C.free(b.mem)
		b.mem, b.sge, b.wrs = nil, nil, nil
	}
}

// SendBatch is a batch of send work requests in C memory, posted with a
// single ibv_post_send (one cgo call) by Post. Adding requests writes C
// memory directly, with no cgo call and no allocation. A SendBatch is not
// safe for concurrent use; give each queue thread its own.
type SendBatch struct {
	batch
	in []sendWR
}

// NewSendBatch allocates a batch of up to maxWR requests with up to maxSGE
// SGEs each. Free releases it.
func NewSendBatch(maxWR, maxSGE int) *SendBatch {
	b := &SendBatch{}
	mem := b.init(maxWR, maxSGE, unsafe.Sizeof(sendWR{}), C.sizeof_struct_ibv_send_wr)
	b.in = unsafe.Slice((*sendWR)(mem), b.maxWR)
	return b
}

// Len returns the number of requests in the batch.
func (b *SendBatch) Len() int { return b.n }

// Cap returns the most requests the batch holds.
func (b *SendBatch) Cap() int { return b.maxWR }

// Reset empties the batch.
func (b *SendBatch) Reset() { b.n = 0 }

// Add appends a work request with the given SGEs (none for a zero-length
// request) and returns ErrBatchFull or ErrTooManySGE if it does not fit.
func (b *SendBatch) Add(wr SendWR, sges ...SGE) error {
	if b.n == b.maxWR {
		return ErrBatchFull
	}
	if len(sges) > b.maxSGE {
		return ErrTooManySGE
	}
	w := &b.in[b.n]
	*w = sendWR{
		id:         wr.ID,
		remoteAddr: wr.RemoteAddr,
		rkey:       wr.RKey,
		imm:        wr.Imm,
		opcode:     uint32(wr.Opcode),
		flags:      uint32(wr.Flags),
		numSGE:     uint32(len(sges)),
	}
	copy(b.sge[b.n*b.maxSGE:], sges)
	b.n++
	return nil
}

// AddSGE appends an SGE to the last request added.
func (b *SendBatch) AddSGE(sge SGE) error {
	if b.n == 0 {
		return ErrEmptyBatch
	}
	w := &b.in[b.n-1]
	if int(w.numSGE) == b.maxSGE {
		return ErrTooManySGE
	}
	b.sge[(b.n-1)*b.maxSGE+int(w.numSGE)] = sge
	w.numSGE++
	return nil
}

// Post chains the batch's requests and posts them on qp with one
// ibv_post_send, then empties the batch. It returns how many were posted;
// on failure the error is a *PostError naming the first request refused.
// It does not allocate unless it fails.
func (b *SendBatch) Post(qp *QP) (int, error) {
	n := b.n
	b.n = 0
	if n == 0 {
		return 0, nil
	}
	if qp.qp == nil {
		return 0, ErrClosed
	}
	var bad C.int
	ret := C.urnbd_post_send(qp.qp, (*C.struct_urnbd_send_wr)(b.mem),
		(*C.struct_ibv_send_wr)(b.wrs), (*C.struct_ibv_sge)(unsafe.Pointer(&b.sge[0])),
		C.int(b.maxSGE), C.int(n), &bad)
	if ret != 0 {
		return int(bad), &PostError{Op: "ibv_post_send", Index: int(bad), Err: retErrno(int(ret), nil)}
	}
	return n, nil
}

// Free releases the batch's C memory.
func (b *SendBatch) Free() { b.free(); b.in = nil; b.n = 0 }

// RecvBatch is a batch of receive work requests in C memory, posted with
// a single ibv_post_recv by Post; like SendBatch.
type RecvBatch struct {
	batch
	in []recvWR
}

// NewRecvBatch allocates a batch of up to maxWR receive requests with up
// to maxSGE SGEs each. Free releases it.
func NewRecvBatch(maxWR, maxSGE int) *RecvBatch {
	b := &RecvBatch{}
	mem := b.init(maxWR, maxSGE, unsafe.Sizeof(recvWR{}), C.sizeof_struct_ibv_recv_wr)
	b.in = unsafe.Slice((*recvWR)(mem), b.maxWR)
	return b
}

// Len returns the number of requests in the batch.
func (b *RecvBatch) Len() int { return b.n }

// Cap returns the most requests the batch holds.
func (b *RecvBatch) Cap() int { return b.maxWR }

// Reset empties the batch.
func (b *RecvBatch) Reset() { b.n = 0 }

// Add appends a receive request with ID id into the given SGEs (none for
// a receive that only takes immediate data or zero-length sends).
func (b *RecvBatch) Add(id uint64, sges ...SGE) error {
	if b.n == b.maxWR {
		return ErrBatchFull
	}
	if len(sges) > b.maxSGE {
		return ErrTooManySGE
	}
	b.in[b.n] = recvWR{id: id, numSGE: uint32(len(sges))}
	copy(b.sge[b.n*b.maxSGE:], sges)
	b.n++
	return nil
}

// Post chains the batch's requests and posts them on qp with one
// ibv_post_recv, then empties the batch; like SendBatch.Post.
func (b *RecvBatch) Post(qp *QP) (int, error) {
	n := b.n
	b.n = 0
	if n == 0 {
		return 0, nil
	}
	if qp.qp == nil {
		return 0, ErrClosed
	}
	var bad C.int
	ret := C.urnbd_post_recv(qp.qp, (*C.struct_urnbd_recv_wr)(b.mem),
		(*C.struct_ibv_recv_wr)(b.wrs), (*C.struct_ibv_sge)(unsafe.Pointer(&b.sge[0])),
		C.int(b.maxSGE), C.int(n), &bad)
	if ret != 0 {
		return int(bad), &PostError{Op: "ibv_post_recv", Index: int(bad), Err: retErrno(int(ret), nil)}
	}
	return n, nil
}

// Free releases the batch's C memory.
func (b *RecvBatch) Free() { b.free(); b.in = nil; b.n = 0 }

// htonl is C's htonl, for tests that check ImmToWire against it.
func htonl(v uint32) uint32 { return uint32(C.urnbd_htonl(C.uint32_t(v))) }
