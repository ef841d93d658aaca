package rtrs

import (
	"strconv"
)

// Immediate data layout: the 32-bit immediate of an RDMA-WRITE-with-IMM or
// SEND-with-IMM holds a 4-bit type in bits 31..28 and a 28-bit payload in
// bits 27..0.
//
// The kernel stores cpu_to_be32(imm) in the work request, so on the wire (and
// in ibv_send_wr.imm_data / ibv_wc.imm_data) the value is in network byte
// order: rdma.ImmToWire and rdma.ImmFromWire convert. The functions here
// work on the host-order value.
const (
	// ImmTypeBits (4) is the width of the immediate type field.
	ImmTypeBits = 4
	// ImmPayloadBits (28) is the width of the immediate payload field.
	ImmPayloadBits = 28
	// ImmPayloadMask (0x0FFFFFFF) selects the payload.
	ImmPayloadMask = 1<<ImmPayloadBits - 1

	// IORspErrnoBits (9): bits 27..19 of an IO response payload hold the
	// positive errno.
	IORspErrnoBits = 9
	// IORspMsgIDBits (19): bits 18..0 of an IO response payload hold the
	// msg_id (the chunk index of the request).
	IORspMsgIDBits = 19
	// MaxIORspErrno (511) is the largest errno an IO response can carry.
	MaxIORspErrno = 1<<IORspErrnoBits - 1
	// MaxIORspMsgID (524287) is the largest msg_id an IO response can carry.
	MaxIORspMsgID = 1<<IORspMsgIDBits - 1

	// HeartbeatImm (0x80000000) is the immediate of a heartbeat, a
	// zero-length RDMA-WRITE-with-IMM on connection 0.
	HeartbeatImm uint32 = uint32(ImmHBMsg) << ImmPayloadBits
	// HeartbeatAckImm (0x90000000) is the immediate of a heartbeat answer.
	HeartbeatAckImm uint32 = uint32(ImmHBAck) << ImmPayloadBits
)

// ImmType is the 4-bit type in bits 31..28 of an immediate value.
type ImmType uint8

// Immediate types.
const (
	// ImmIOReq (0), client→server: an IO request was written into a chunk;
	// payload = chunk index (buffer id) and offset of the RTRS header.
	ImmIOReq ImmType = 0
	// ImmIORsp (1), server→client: IO response; payload = errno and msg_id.
	ImmIORsp ImmType = 1
	// ImmIORspWInv (2), server→client: IO response that follows a
	// SEND_WITH_INV which already invalidated the client's rkey.
	ImmIORspWInv ImmType = 2
	// ImmHBMsg (8), either side: heartbeat; payload 0.
	ImmHBMsg ImmType = 8
	// ImmHBAck (9), either side: heartbeat answer; payload 0.
	ImmHBAck ImmType = 9
	// ImmFenceRsp (10), server→client on cid 0, a urnbd extension (only
	// with FlagFence): the answer to a FenceReq; payload -errno (0: the
	// path is closed).
	ImmFenceRsp ImmType = 10
)

// FenceRspImm returns the immediate of a fence answer with errno (0 or
// negative; one that does not fit answers -EIO).
func FenceRspImm(errno int) uint32 {
	if errno > 0 || -errno > ImmPayloadMask {
		errno = -5
	}
	return uint32(ImmFenceRsp)<<ImmPayloadBits | uint32(-errno)
}

// Known reports whether t is one of the immediate types of the protocol.
func (t ImmType) Known() bool {
	switch t {
	case ImmIOReq, ImmIORsp, ImmIORspWInv, ImmHBMsg, ImmHBAck:
		return true
	}
	return false
}

// String returns the kernel-style name of t.
func (t ImmType) String() string {
	switch t {
	case ImmIOReq:
		return "IO_REQ"
	case ImmIORsp:
		return "IO_RSP"
	case ImmIORspWInv:
		return "IO_RSP_W_INV"
	case ImmHBMsg:
		return "HB_MSG"
	case ImmHBAck:
		return "HB_ACK"
	case ImmFenceRsp:
		return "FENCE_RSP"
	}
	return "ImmType(" + strconv.Itoa(int(t)) + ")"
}

// MakeImm combines a type and a 28-bit payload into an immediate value. It
// fails if t does not fit 4 bits or payload does not fit 28 bits.
func MakeImm(t ImmType, payload uint32) (uint32, error) {
	if t >= 1<<ImmTypeBits {
		return 0, wireErr(ErrOutOfRange, "imm", "type %d does not fit %d bits", t, ImmTypeBits)
	}
	if payload > ImmPayloadMask {
		return 0, wireErr(ErrOutOfRange, "imm", "payload %#x does not fit %d bits", payload, ImmPayloadBits)
	}
	return uint32(t)<<ImmPayloadBits | payload, nil
}

// SplitImm splits an immediate value into its type and payload.
func SplitImm(imm uint32) (ImmType, uint32) {
	return ImmType(imm >> ImmPayloadBits), imm & ImmPayloadMask
}

// IORspImm encodes an IO response immediate: type ImmIORspWInv if withInv
// else ImmIORsp, payload = (|errno| << 19) | msgID. errno may be given
// negative (kernel style) or positive; 0 means success. It fails if msgID
// exceeds MaxIORspMsgID or |errno| exceeds MaxIORspErrno (the kernel would
// silently truncate both).
func IORspImm(msgID uint32, errno int, withInv bool) (uint32, error) {
	if msgID > MaxIORspMsgID {
		return 0, wireErr(ErrOutOfRange, "io_rsp imm", "msg_id %d exceeds %d", msgID, MaxIORspMsgID)
	}
	e := errno
	if e < 0 {
		e = -e
	}
	if e < 0 || e > MaxIORspErrno {
		return 0, wireErr(ErrOutOfRange, "io_rsp imm", "errno %d does not fit %d bits", errno, IORspErrnoBits)
	}
	t := ImmIORsp
	if withInv {
		t = ImmIORspWInv
	}
	return uint32(t)<<ImmPayloadBits | uint32(e)<<IORspMsgIDBits | msgID, nil
}

// SplitIORspPayload splits the payload of an IO response immediate into
// msg_id and errno; the errno is returned negated (0 or negative), as the
// kernel client does.
func SplitIORspPayload(payload uint32) (msgID uint32, errno int) {
	return payload & MaxIORspMsgID, -int(payload >> IORspMsgIDBits & MaxIORspErrno)
}

// Imm is a decoded immediate value.
type Imm struct {
	// Type is the immediate type.
	Type ImmType
	// BufID is the chunk index: the buffer id of an IO_REQ, the msg_id of an
	// IO_RSP/IO_RSP_W_INV. Zero for heartbeats.
	BufID uint32
	// Off is, for IO_REQ only, the byte offset inside the chunk of the RTRS
	// request header (= data length + user message length).
	Off uint32
	// Errno is, for IO_RSP/IO_RSP_W_INV only, 0 on success or the negated
	// errno carried in the 9-bit field.
	Errno int
}

// ImmCodec encodes and decodes immediates in the context of one session:
// the IO_REQ payload layout depends on the queue depth (number of chunks) and
// both directions validate buffer ids against it. The zero value is not
// usable; create one with NewImmCodec. An ImmCodec is a small value, safe to
// copy and to use concurrently.
type ImmCodec struct {
	queueDepth uint32
	chunkSize  uint32
	memBits    uint8
}

// NewImmCodec returns the codec for a session of queueDepth chunks of
// chunkSize bytes. The payload of an IO_REQ is (bufID << memBits) | off with
// chunkBits = BitsFor(queueDepth-1) and memBits = 28 - chunkBits. It fails
// unless queueDepth is in 1..MaxSessQueueDepth and CheckImmFit holds.
func NewImmCodec(queueDepth, chunkSize int) (ImmCodec, error) {
	if err := CheckImmFit(queueDepth, chunkSize); err != nil {
		return ImmCodec{}, err
	}
	return ImmCodec{
		queueDepth: uint32(queueDepth),
		chunkSize:  uint32(chunkSize),
		memBits:    uint8(ImmPayloadBits - BitsFor(uint32(queueDepth-1))),
	}, nil
}

// QueueDepth returns the number of chunks of the session.
func (c ImmCodec) QueueDepth() int { return int(c.queueDepth) }

// ChunkSize returns the chunk size in bytes.
func (c ImmCodec) ChunkSize() int { return int(c.chunkSize) }

// MemBits returns the number of low payload bits that hold the offset of an
// IO_REQ (28 - chunk bits). For queue depth 512 it is 19.
func (c ImmCodec) MemBits() int { return int(c.memBits) }

// IOReq encodes the immediate of an IO request for chunk bufID with the RTRS
// header at byte offset off in the chunk. It fails unless bufID < queue
// depth and off < chunk size.
func (c ImmCodec) IOReq(bufID, off uint32) (uint32, error) {
	if c.queueDepth == 0 {
		return 0, wireErr(ErrOutOfRange, "io_req imm", "zero ImmCodec")
	}
	if bufID >= c.queueDepth {
		return 0, wireErr(ErrOutOfRange, "io_req imm", "buf_id %d >= queue depth %d", bufID, c.queueDepth)
	}
	if off >= c.chunkSize {
		return 0, wireErr(ErrOutOfRange, "io_req imm", "offset %d >= chunk size %d", off, c.chunkSize)
	}
	return bufID<<c.memBits | off, nil
}

// IORsp encodes an IO response immediate like IORspImm and also checks
// msgID < queue depth.
func (c ImmCodec) IORsp(msgID uint32, errno int, withInv bool) (uint32, error) {
	if msgID >= c.queueDepth {
		return 0, wireErr(ErrOutOfRange, "io_rsp imm", "msg_id %d >= queue depth %d", msgID, c.queueDepth)
	}
	return IORspImm(msgID, errno, withInv)
}

// Encode encodes m: IO_REQ from BufID and Off, IO_RSP/IO_RSP_W_INV from
// BufID and Errno, heartbeats as HeartbeatImm/HeartbeatAckImm. Fields that do
// not belong to the type must be zero.
func (c ImmCodec) Encode(m Imm) (uint32, error) {
	switch m.Type {
	case ImmIOReq:
		if m.Errno != 0 {
			return 0, wireErr(ErrOutOfRange, "imm", "errno %d set on %v", m.Errno, m.Type)
		}
		return c.IOReq(m.BufID, m.Off)
	case ImmIORsp, ImmIORspWInv:
		if m.Off != 0 {
			return 0, wireErr(ErrOutOfRange, "imm", "offset %d set on %v", m.Off, m.Type)
		}
		return c.IORsp(m.BufID, m.Errno, m.Type == ImmIORspWInv)
	case ImmHBMsg, ImmHBAck:
		if m.BufID != 0 || m.Off != 0 || m.Errno != 0 {
			return 0, wireErr(ErrOutOfRange, "imm", "payload fields set on %v", m.Type)
		}
		return uint32(m.Type) << ImmPayloadBits, nil
	}
	return 0, wireErr(ErrBadType, "imm", "unknown immediate type %d", uint8(m.Type))
}

// Decode decodes and validates a host-order immediate value:
//   - IO_REQ: BufID < queue depth and Off < chunk size, else ErrOutOfRange
//     (the kernel server closes the path);
//   - IO_RSP/IO_RSP_W_INV: BufID (msg_id) < queue depth, else ErrOutOfRange;
//     Errno is 0 or negative;
//   - HB_MSG/HB_ACK: the payload is ignored, as the kernel does;
//   - any other type: ErrBadType (the kernel logs and ignores it).
func (c ImmCodec) Decode(imm uint32) (Imm, error) {
	t, payload := SplitImm(imm)
	switch t {
	case ImmIOReq:
		bufID := payload >> c.memBits
		off := payload & (1<<c.memBits - 1)
		if bufID >= c.queueDepth {
			return Imm{}, wireErr(ErrOutOfRange, "io_req imm", "buf_id %d >= queue depth %d (imm %#08x)", bufID, c.queueDepth, imm)
		}
		if off >= c.chunkSize {
			return Imm{}, wireErr(ErrOutOfRange, "io_req imm", "offset %d >= chunk size %d (imm %#08x)", off, c.chunkSize, imm)
		}
		return Imm{Type: t, BufID: bufID, Off: off}, nil
	case ImmIORsp, ImmIORspWInv:
		id, errno := SplitIORspPayload(payload)
		if id >= c.queueDepth {
			return Imm{}, wireErr(ErrOutOfRange, "io_rsp imm", "msg_id %d >= queue depth %d (imm %#08x)", id, c.queueDepth, imm)
		}
		return Imm{Type: t, BufID: id, Errno: errno}, nil
	case ImmHBMsg, ImmHBAck:
		return Imm{Type: t}, nil
	}
	return Imm{}, wireErr(ErrBadType, "imm", "unknown immediate type %d (imm %#08x)", uint8(t), imm)
}
