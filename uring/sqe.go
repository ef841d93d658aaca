package uring

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// SQE mirrors struct io_uring_sqe, a 64-byte submission queue entry. Unions
// of the C struct are named after their most common member:
//
//	offset  C field(s)                                     SQE field
//	     0  opcode                                         Opcode
//	     1  flags                                          Flags
//	     2  ioprio                                         IoPrio
//	     4  fd                                             Fd
//	     8  off, addr2, {cmd_op, __pad1}                   Off (see CmdOp)
//	    16  addr, splice_off_in, {level, optname}          Addr
//	    24  len                                            Len
//	    28  rw_flags, fsync_flags, poll32_events, ...      OpFlags
//	    32  user_data                                      UserData
//	    40  buf_index, buf_group                           BufIndex
//	    42  personality                                    Personality
//	    44  splice_fd_in, file_index, optlen, {addr_len}   SpliceFdIn
//	    48  addr3, optval, cmd[] (start)                   Addr3
//	    56  __pad2[0]                                      -
//
// SQEs live in memory shared with the kernel; get them from Ring.GetSQE,
// fill them in (usually with one of the Prep methods) and submit them. The
// kernel reads an SQE when it is submitted, so the slot may be reused
// afterwards, but the memory it points to must stay valid until the request
// completes (see "Memory handed to the kernel" in the package
// documentation).
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IoPrio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	_           uint64
}

// SQE128 is a 128-byte submission queue entry, as used by rings created
// with SetupSQE128: the 64-byte SQE followed by 64 more bytes that, with the
// last 16 bytes of the SQE, form the 80-byte URING_CMD payload.
//
// Only Ring.GetSQE128 hands out an SQE128, and only on an SQE128 ring, so
// the payload returned by Cmd is always backed by the ring's memory.
type SQE128 struct {
	SQE
	_ [64]byte
}

// cmdOffset is the offset of the URING_CMD payload (sqe->cmd) in an SQE.
const cmdOffset = 48

// Cmd returns the URING_CMD payload, sqe->cmd: the 80 bytes at offsets
// 48..127 of the entry. It overlays Addr3 and the padding after it, so Prep
// methods (which rewrite the first 64 bytes) must be called before the
// payload is filled in.
func (s *SQE128) Cmd() *[80]byte {
	return (*[80]byte)(unsafe.Add(unsafe.Pointer(s), cmdOffset))
}

// Cmd16 returns the first 16 bytes of the URING_CMD payload, sqe->cmd at
// offsets 48..63 (over Addr3 and the padding after it). They exist in every
// SQE, so Cmd16 is safe on 64-byte rings too, for commands whose payload fits
// (ublk's struct ublksrv_io_cmd, for one). Call it after the Prep method.
func (s *SQE) Cmd16() *[16]byte {
	return (*[16]byte)(unsafe.Pointer(&s.Addr3))
}

// CmdOp returns the URING_CMD command, sqe->cmd_op: the 32-bit word at
// offset 8, which shares its storage with Off.
func (s *SQE) CmdOp() uint32 {
	return *(*uint32)(unsafe.Pointer(&s.Off))
}

// SetCmdOp sets sqe->cmd_op and clears the 32 bits after it (__pad1), which
// the kernel requires to be zero.
func (s *SQE) SetCmdOp(op uint32) {
	s.Off = 0
	*(*uint32)(unsafe.Pointer(&s.Off)) = op
}

// KernelTimespec mirrors struct __kernel_timespec, which has 64-bit fields
// on every architecture (unlike unix.Timespec on 32-bit ones).
type KernelTimespec struct {
	Sec  int64
	Nsec int64
}

// NsecToTimespec converts a duration in nanoseconds to a KernelTimespec.
func NsecToTimespec(nsec int64) KernelTimespec {
	return KernelTimespec{Sec: nsec / 1e9, Nsec: nsec % 1e9}
}

// The Prep methods overwrite the first 64 bytes of the SQE: every field not
// named by the method is zeroed. Set Flags, IoPrio, Personality and the like
// after calling them. On a 128-byte SQE the extra 64 bytes are left alone.

// PrepNop prepares an IORING_OP_NOP, which completes with Res 0.
func (s *SQE) PrepNop(userData uint64) {
	*s = SQE{Opcode: OpNop, UserData: userData}
}

// prepRW fills in the fields shared by the read/write family, liburing's
// io_uring_prep_rw.
func (s *SQE) prepRW(op uint8, fd int32, a uint64, n uint32, off uint64, userData uint64) {
	*s = SQE{Opcode: op, Fd: fd, Off: off, Addr: a, Len: n, UserData: userData}
}

// PrepRead prepares an IORING_OP_READ of n bytes at file offset off into
// buf, like pread(2). An offset of ^uint64(0) means the current file
// position (FeatRWCurPos). Res is the number of bytes read or -errno.
func (s *SQE) PrepRead(fd int32, buf unsafe.Pointer, n uint32, off uint64, userData uint64) {
	s.prepRW(OpRead, fd, addr(buf), n, off, userData)
}

// PrepWrite prepares an IORING_OP_WRITE of n bytes from buf at file offset
// off, like pwrite(2).
func (s *SQE) PrepWrite(fd int32, buf unsafe.Pointer, n uint32, off uint64, userData uint64) {
	s.prepRW(OpWrite, fd, addr(buf), n, off, userData)
}

// PrepReadv prepares an IORING_OP_READV, like preadv(2). The iovec array
// must stay valid until the SQE is submitted, the buffers it names until
// the request completes.
func (s *SQE) PrepReadv(fd int32, iovs []unix.Iovec, off uint64, userData uint64) {
	s.prepRW(OpReadv, fd, iovAddr(iovs), uint32(len(iovs)), off, userData)
}

// PrepWritev prepares an IORING_OP_WRITEV, like pwritev(2).
func (s *SQE) PrepWritev(fd int32, iovs []unix.Iovec, off uint64, userData uint64) {
	s.prepRW(OpWritev, fd, iovAddr(iovs), uint32(len(iovs)), off, userData)
}

func iovAddr(iovs []unix.Iovec) uint64 {
	return addr(unsafe.Pointer(unsafe.SliceData(iovs)))
}

// PrepReadFixed prepares an IORING_OP_READ_FIXED into registered buffer
// bufIndex (see Ring.RegisterBuffers); buf..buf+n must lie inside it.
func (s *SQE) PrepReadFixed(fd int32, buf unsafe.Pointer, n uint32, off uint64, bufIndex uint16, userData uint64) {
	s.PrepReadFixedAt(fd, addr(buf), n, off, bufIndex, userData)
}

// PrepReadFixedAt prepares an IORING_OP_READ_FIXED into registered buffer
// bufIndex at address bufAddr: for a buffer that a driver installed (see
// RegisterBuffersSparse), the offset into it.
func (s *SQE) PrepReadFixedAt(fd int32, bufAddr uint64, n uint32, off uint64, bufIndex uint16, userData uint64) {
	s.prepRW(OpReadFixed, fd, bufAddr, n, off, userData)
	s.BufIndex = bufIndex
}

// PrepWriteFixedAt prepares an IORING_OP_WRITE_FIXED, as PrepReadFixedAt.
func (s *SQE) PrepWriteFixedAt(fd int32, bufAddr uint64, n uint32, off uint64, bufIndex uint16, userData uint64) {
	s.prepRW(OpWriteFixed, fd, bufAddr, n, off, userData)
	s.BufIndex = bufIndex
}

// PrepWriteFixed prepares an IORING_OP_WRITE_FIXED from registered buffer
// bufIndex.
func (s *SQE) PrepWriteFixed(fd int32, buf unsafe.Pointer, n uint32, off uint64, bufIndex uint16, userData uint64) {
	s.PrepWriteFixedAt(fd, addr(buf), n, off, bufIndex, userData)
}

// PrepFsync prepares an IORING_OP_FSYNC of the whole file; flags is 0 or
// FsyncDatasync. (Off and Len may then be set to sync a range only.)
func (s *SQE) PrepFsync(fd int32, flags uint32, userData uint64) {
	*s = SQE{Opcode: OpFsync, Fd: fd, OpFlags: flags, UserData: userData}
}

// PrepFallocate prepares an IORING_OP_FALLOCATE, like fallocate(2) with
// the given mode (unix.FALLOC_FL_*), offset and length. io_uring passes the
// arguments oddly: the length goes in Addr and the mode in Len.
func (s *SQE) PrepFallocate(fd int32, mode uint32, off, length uint64, userData uint64) {
	*s = SQE{Opcode: OpFallocate, Fd: fd, Off: off, Addr: length, Len: mode, UserData: userData}
}

// PrepPollAdd prepares an IORING_OP_POLL_ADD waiting for events (unix.POLLIN
// and so on) on fd. A one-shot poll completes once with the ready events in
// Res. A multishot poll posts a CQE with CQEFMore set on every wake-up and
// ends with a CQE without CQEFMore, when it is removed or fails.
func (s *SQE) PrepPollAdd(fd int32, events uint32, multishot bool, userData uint64) {
	*s = SQE{Opcode: OpPollAdd, Fd: fd, OpFlags: pollEvents(events), UserData: userData}
	if multishot {
		s.Len = PollAddMulti
	}
}

// PrepPollRemove prepares an IORING_OP_POLL_REMOVE of the poll request
// whose user data is target. The removed poll completes with -ECANCELED;
// this request completes with 0 or -ENOENT.
func (s *SQE) PrepPollRemove(target uint64, userData uint64) {
	*s = SQE{Opcode: OpPollRemove, Fd: -1, Addr: target, UserData: userData}
}

// PrepAsyncCancel prepares an IORING_OP_ASYNC_CANCEL of the request whose
// user data is target. It completes with 0 (found and canceled), -ENOENT
// or -EALREADY; the canceled request completes with -ECANCELED. Other
// matching rules are selected by setting OpFlags (AsyncCancel*) and Fd
// afterwards.
func (s *SQE) PrepAsyncCancel(target uint64, userData uint64) {
	*s = SQE{Opcode: OpAsyncCancel, Fd: -1, Addr: target, UserData: userData}
}

// PrepTimeout prepares an IORING_OP_TIMEOUT that completes when ts elapses
// (Res -ETIME) or, if count > 0, once count other requests have completed
// (Res 0). flags are Timeout* flags, 0 for a relative CLOCK_MONOTONIC
// timeout. The kernel copies *ts at submission.
func (s *SQE) PrepTimeout(ts *KernelTimespec, count uint32, flags uint32, userData uint64) {
	*s = SQE{Opcode: OpTimeout, Fd: -1, Off: uint64(count), Addr: addr(unsafe.Pointer(ts)), Len: 1, OpFlags: flags, UserData: userData}
}

// PrepUringCmd prepares an IORING_OP_URING_CMD: the file's driver-specific
// command cmdOp (sqe->cmd_op, the low 32 bits at offset 8), with the
// command payload in SQE128.Cmd. Files whose driver has no uring_cmd
// support complete it with -EOPNOTSUPP.
func (s *SQE) PrepUringCmd(fd int32, cmdOp uint32, userData uint64) {
	*s = SQE{Opcode: OpUringCmd, Fd: fd, UserData: userData}
	s.SetCmdOp(cmdOp)
}

// pollEvents returns poll events in the layout of sqe->poll32_events, whose
// 16-bit halves are swapped on big-endian machines.
func pollEvents(events uint32) uint32 {
	if bigEndian {
		return events<<16 | events>>16
	}
	return events
}

var bigEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 0
}()
