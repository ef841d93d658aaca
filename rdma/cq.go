package rdma

/*
#cgo noescape urnbd_poll_cq
#cgo nocallback urnbd_poll_cq
#cgo noescape ibv_get_cq_event
#cgo nocallback ibv_get_cq_event
#cgo noescape urnbd_req_notify_cq
#cgo nocallback urnbd_req_notify_cq
#cgo noescape ibv_ack_cq_events
#cgo nocallback ibv_ack_cq_events
#include "crdma.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CompChannel is a completion channel (struct ibv_comp_channel): a file
// descriptor that becomes readable when a CQ armed with ReqNotify gets a
// completion.
type CompChannel struct {
	ch  *C.struct_ibv_comp_channel
	ctx Context
	// readable: the device's provider does nothing when it hands out an
	// event (see ReadableEvents).
	readable bool
}

// EventSize is the size of one event as read(2) of a completion channel's
// fd returns it: struct ib_uverbs_comp_event_desc, which holds only the
// CQ's user handle (CQ.UserHandle), a native-endian 64-bit word.
const EventSize = 8

// vendorRXE is the vendor ID that the kernel's soft-RoCE driver (rxe)
// reports (RXE_VENDOR_ID in drivers/infiniband/sw/rxe/rxe_param.h).
const vendorRXE = 0xffffff

// NewCompChannel creates a completion channel on the device
// (ibv_create_comp_channel).
func (c Context) NewCompChannel() (*CompChannel, error) {
	if c.ctx == nil {
		return nil, ErrClosed
	}
	ch, err := C.ibv_create_comp_channel(c.ctx)
	if ch == nil {
		return nil, fmt.Errorf("ibv_create_comp_channel %s: %w", c.DeviceName(), errnoOf(err))
	}
	cc := &CompChannel{ch: ch, ctx: c}
	if a, err := c.QueryDevice(); err == nil && a.VendorID == vendorRXE {
		cc.readable = true
	}
	return cc, nil
}

// ReadableEvents reports whether the caller may take the channel's events
// by reading them from Fd itself, EventSize bytes each (with read(2), or
// an io_uring READ submitted with the next wait, which saves the
// wake-up one system call), acknowledging each with CQ.AckRead, instead of
// with GetEvent or TakeEvent. ibv_get_cq_event, after its read, calls the
// provider's cq_event hook, which mlx4 and mlx5 use to count arm sequence
// numbers: a CQ armed without it may raise no event. So this is true only
// for rxe, whose rdma-core provider has no such hook.
func (ch *CompChannel) ReadableEvents() bool { return ch.readable }

// Fd returns the channel's file descriptor, to wait on with poll(2), epoll
// or io_uring (IORING_OP_POLL_ADD): it is readable when a CQ event is
// pending.
func (ch *CompChannel) Fd() int { return int(ch.ch.fd) }

// SetNonblock puts the channel's fd in (or out of) non-blocking mode; then
// GetEvent returns unix.EAGAIN (unwrapped, without allocating) when no
// event is pending.
func (ch *CompChannel) SetNonblock(nonblocking bool) error {
	if err := unix.SetNonblock(ch.Fd(), nonblocking); err != nil {
		return fmt.Errorf("rdma: completion channel fd %d: set nonblock: %w", ch.Fd(), err)
	}
	return nil
}

// GetEvent returns the CQ that has a completion event pending on the
// channel (ibv_get_cq_event). Each event must be acknowledged with
// CQ.Ack (acknowledging several at once is cheaper), and the CQ re-armed
// with ReqNotify before polling it empty, or later completions give no
// event. It does not allocate.
func (ch *CompChannel) GetEvent() (*CQ, error) {
	if ch.ch == nil {
		return nil, ErrClosed
	}
	var cq *C.struct_ibv_cq
	var ctx unsafe.Pointer
	ret, err := C.ibv_get_cq_event(ch.ch, &cq, &ctx)
	if ret != 0 {
		e := errnoOf(err)
		if e == syscall.EAGAIN {
			return nil, unix.EAGAIN
		}
		return nil, fmt.Errorf("ibv_get_cq_event: %w", e)
	}
	cqs.RLock()
	q := cqs.m[cq]
	cqs.RUnlock()
	if q != nil {
		q.unacked.Add(1)
	}
	return q, nil
}

// TakeEvent takes the event pending on a channel that serves cq alone,
// and acknowledges it (ibv_get_cq_event, ibv_ack_cq_events); it reports
// whether there was one. Unlike GetEvent it looks up nothing: no lock,
// no map. The channel must be non-blocking (SetNonblock). An event of
// another CQ on the channel is an error (and acknowledged).
func (ch *CompChannel) TakeEvent(cq *CQ) (bool, error) {
	if ch.ch == nil {
		return false, ErrClosed
	}
	var got *C.struct_ibv_cq
	var ctx unsafe.Pointer
	ret, err := C.ibv_get_cq_event(ch.ch, &got, &ctx)
	if ret != 0 {
		e := errnoOf(err)
		if e == syscall.EAGAIN {
			return false, nil
		}
		return false, fmt.Errorf("ibv_get_cq_event: %w", e)
	}
	C.ibv_ack_cq_events(got, 1)
	if got != cq.cq {
		return false, fmt.Errorf("ibv_get_cq_event: an event of another CQ on a channel of one: %w", syscall.EINVAL)
	}
	return true, nil
}

// Close destroys the channel (ibv_destroy_comp_channel); its CQs must be
// destroyed first.
func (ch *CompChannel) Close() error {
	if ch.ch == nil {
		return ErrClosed
	}
	if ret, err := C.ibv_destroy_comp_channel(ch.ch); ret != 0 {
		return fmt.Errorf("ibv_destroy_comp_channel: %w", retErrno(int(ret), err))
	}
	ch.ch = nil
	return nil
}

// cqs maps rdma-core's CQs to ours for CompChannel.GetEvent.
var cqs = struct {
	sync.RWMutex
	m map[*C.struct_ibv_cq]*CQ
}{m: make(map[*C.struct_ibv_cq]*CQ)}

// pollChunk is how many completions a CQ polls from the provider at a
// time; Poll loops in C for larger batches.
const pollChunk = 64

// CQ is a completion queue (struct ibv_cq).
type CQ struct {
	cq  *C.struct_ibv_cq
	ch  *CompChannel
	tmp *C.struct_ibv_wc // pollChunk entries, C memory
	// unacked counts events GetEvent returned and Ack did not yet
	// acknowledge, so that Destroy does not hang on them.
	unacked atomic.Int64
}

// NewCQ creates a completion queue with room for at least cqe completions
// (ibv_create_cq), reporting events on ch (nil for none), on completion
// vector compVector (0 ≤ compVector < NumCompVectors).
func (c Context) NewCQ(cqe int, ch *CompChannel, compVector int) (*CQ, error) {
	if c.ctx == nil {
		return nil, ErrClosed
	}
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	cq, err := C.ibv_create_cq(c.ctx, C.int(cqe), nil, cch, C.int(compVector))
	if cq == nil {
		return nil, fmt.Errorf("ibv_create_cq %s cqe %d vector %d: %w", c.DeviceName(), cqe, compVector, errnoOf(err))
	}
	q := &CQ{cq: cq, ch: ch}
	q.tmp = (*C.struct_ibv_wc)(C.calloc(pollChunk, C.sizeof_struct_ibv_wc))
	cqs.Lock()
	cqs.m[cq] = q
	cqs.Unlock()
	return q, nil
}

// UserHandle returns the handle libibverbs gave the kernel for this CQ
// at creation: the address of the process's struct ibv_cq (ibv_cmd_create_cq
// and ibv_cmd_create_cq_ex send user_handle = (uintptr_t)cq, the pointer
// ibv_create_cq returns). The kernel keeps it in the CQ's uobject
// (cq->uobject->uevent.uobject.user_handle) and hands it back in every
// completion event, which is how GetEvent finds the CQ; an eBPF program
// on the kernel's completion path (ib_uverbs_comp_handler) can read it
// there to tell which of the process's CQs completed. It is 0 after
// Destroy.
func (q *CQ) UserHandle() uint64 { return uint64(uintptr(unsafe.Pointer(q.cq))) }

// CQE returns the CQ's actual capacity.
func (q *CQ) CQE() int { return int(q.cq.cqe) }

// Channel returns the completion channel the CQ reports on, or nil.
func (q *CQ) Channel() *CompChannel { return q.ch }

// ReqNotify arms the CQ (ibv_req_notify_cq): the next completion (the
// next solicited one if solicitedOnly) makes the completion channel
// readable. Arm, then poll the CQ empty, to miss no completion.
func (q *CQ) ReqNotify(solicitedOnly bool) error {
	if q.cq == nil {
		return ErrClosed
	}
	so := C.int(0)
	if solicitedOnly {
		so = 1
	}
	if ret, err := C.urnbd_req_notify_cq(q.cq, so); ret != 0 {
		return fmt.Errorf("ibv_req_notify_cq: %w", retErrno(int(ret), err))
	}
	return nil
}

// Ack acknowledges n events of this CQ returned by CompChannel.GetEvent
// (ibv_ack_cq_events); acknowledging several at once is cheaper.
func (q *CQ) Ack(n int) {
	if n <= 0 || q.cq == nil {
		return
	}
	q.unacked.Add(-int64(n))
	C.ibv_ack_cq_events(q.cq, C.uint(n))
}

// AckRead acknowledges an event that the caller read from the channel's
// fd itself (see CompChannel.ReadableEvents): ev is the word it read. An
// event of another CQ is an error, and not acknowledged: it cannot be,
// from here (a channel that serves one CQ never has one).
func (q *CQ) AckRead(ev uint64) error {
	if q.cq == nil {
		return ErrClosed
	}
	if ev != q.UserHandle() {
		return fmt.Errorf("rdma: completion event of CQ %#x read on a channel of CQ %#x: %w", ev, q.UserHandle(), syscall.EINVAL)
	}
	C.ibv_ack_cq_events(q.cq, 1)
	return nil
}

// Poll polls up to len(wcs) completions into wcs (ibv_poll_cq) and returns
// how many it got. The whole batch is polled and converted in C in one cgo
// call, with no allocation. After Destroy it returns ErrClosed.
func (q *CQ) Poll(wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	if q.cq == nil {
		return 0, ErrClosed
	}
	n := C.urnbd_poll_cq(q.cq, q.tmp, pollChunk, (*C.struct_urnbd_wc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)))
	if n < 0 {
		return 0, fmt.Errorf("ibv_poll_cq: %w", retErrno(int(n), nil))
	}
	return int(n), nil
}

// Destroy destroys the CQ (ibv_destroy_cq); its QPs must be gone.
// ibv_destroy_cq waits for every event returned by GetEvent to be
// acknowledged, so Destroy first acknowledges those that Ack did not.
func (q *CQ) Destroy() error {
	if q.cq == nil {
		return ErrClosed
	}
	cq := q.cq
	if n := q.unacked.Swap(0); n > 0 {
		C.ibv_ack_cq_events(cq, C.uint(n))
	}
	if ret, err := C.ibv_destroy_cq(cq); ret != 0 {
		return fmt.Errorf("ibv_destroy_cq: %w", retErrno(int(ret), err))
	}
	cqs.Lock()
	delete(cqs.m, cq)
	cqs.Unlock()
	C.free(unsafe.Pointer(q.tmp))
	q.cq, q.tmp = nil, nil
	return nil
}

// WCStatus is a work completion status (enum ibv_wc_status).
type WCStatus uint32

// Work completion statuses (the common ones; see enum ibv_wc_status).
const (
	WCSuccess        WCStatus = C.IBV_WC_SUCCESS
	WCLocLenErr      WCStatus = C.IBV_WC_LOC_LEN_ERR
	WCLocQPOpErr     WCStatus = C.IBV_WC_LOC_QP_OP_ERR
	WCLocProtErr     WCStatus = C.IBV_WC_LOC_PROT_ERR
	WCWRFlushErr     WCStatus = C.IBV_WC_WR_FLUSH_ERR
	WCMWBindErr      WCStatus = C.IBV_WC_MW_BIND_ERR
	WCBadRespErr     WCStatus = C.IBV_WC_BAD_RESP_ERR
	WCLocAccessErr   WCStatus = C.IBV_WC_LOC_ACCESS_ERR
	WCRemInvReqErr   WCStatus = C.IBV_WC_REM_INV_REQ_ERR
	WCRemAccessErr   WCStatus = C.IBV_WC_REM_ACCESS_ERR
	WCRemOpErr       WCStatus = C.IBV_WC_REM_OP_ERR
	WCRetryExcErr    WCStatus = C.IBV_WC_RETRY_EXC_ERR
	WCRNRRetryExcErr WCStatus = C.IBV_WC_RNR_RETRY_EXC_ERR
	WCRemAbortErr    WCStatus = C.IBV_WC_REM_ABORT_ERR
	WCGeneralErr     WCStatus = C.IBV_WC_GENERAL_ERR
)

// String returns libibverbs' description of the status
// (ibv_wc_status_str), e.g. "success", "Work Request Flushed Error".
func (s WCStatus) String() string {
	return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(s)))
}

// WCOpcode is the operation of a work completion (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes. Receive completions have WCRecv set
// (WCRecv, WCRecvRDMAWithImm).
const (
	WCSend            WCOpcode = C.IBV_WC_SEND
	WCRDMAWrite       WCOpcode = C.IBV_WC_RDMA_WRITE
	WCRDMARead        WCOpcode = C.IBV_WC_RDMA_READ
	WCCompSwap        WCOpcode = C.IBV_WC_COMP_SWAP
	WCFetchAdd        WCOpcode = C.IBV_WC_FETCH_ADD
	WCBindMW          WCOpcode = C.IBV_WC_BIND_MW
	WCLocalInv        WCOpcode = C.IBV_WC_LOCAL_INV
	WCRecv            WCOpcode = C.IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = C.IBV_WC_RECV_RDMA_WITH_IMM
)

var wcOpcodeNames = map[WCOpcode]string{
	WCSend: "SEND", WCRDMAWrite: "RDMA_WRITE", WCRDMARead: "RDMA_READ",
	WCCompSwap: "COMP_SWAP", WCFetchAdd: "FETCH_ADD", WCBindMW: "BIND_MW",
	WCLocalInv: "LOCAL_INV", WCRecv: "RECV", WCRecvRDMAWithImm: "RECV_RDMA_WITH_IMM",
}

func (o WCOpcode) String() string {
	if s, ok := wcOpcodeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags are work completion flags (enum ibv_wc_flags).
type WCFlags uint32

// Work completion flags.
const (
	WCWithGRH WCFlags = C.IBV_WC_GRH
	WCWithImm WCFlags = C.IBV_WC_WITH_IMM
	WCWithInv WCFlags = C.IBV_WC_WITH_INV
)

// WC is a work completion (the useful part of struct ibv_wc), laid out as
// the C struct urnbd_wc that Poll fills.
type WC struct {
	WRID      uint64   // the work request's ID
	Status    WCStatus // WCSuccess or the error
	Opcode    WCOpcode // valid when Status is WCSuccess
	VendorErr uint32
	ByteLen   uint32 // bytes received, for receive completions
	// Imm is the immediate data, in host byte order (converted with
	// ntohl from the wire's big-endian __be32, as the kernel's RTRS does),
	// when Flags has WCWithImm; the invalidated rkey when it has
	// WCWithInv; else 0.
	Imm   uint32
	Flags WCFlags
	QPNum uint32 // local QP the completion belongs to
	SrcQP uint32
}

// HasImm reports whether the completion carries immediate data.
func (w *WC) HasImm() bool { return w.Flags&WCWithImm != 0 }

// The Go and C layouts of a WC must agree.
var (
	_ [unsafe.Sizeof(WC{}) - C.sizeof_struct_urnbd_wc]byte
	_ [C.sizeof_struct_urnbd_wc - unsafe.Sizeof(WC{})]byte
	_ [unsafe.Offsetof(WC{}.SrcQP) - C.offsetof_urnbd_wc_src_qp]byte
	_ [C.offsetof_urnbd_wc_src_qp - unsafe.Offsetof(WC{}.SrcQP)]byte
)
