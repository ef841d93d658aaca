// Package frame is the framing of RTRS over TCP (see package rtrs/tcp for
// the format): frame headers, their encoding, and the incremental Decoder
// that checks every frame against the session before its payload lands.
// It knows nothing of sockets or sessions.
package frame

import (
	"encoding/binary"
	"fmt"

	"github.com/urnbd/urnbd/rtrs"
)

const (
	// HeaderSize (12) is the size of the fixed frame header.
	HeaderSize = 12
	// ImmCtrl (15) is the immediate type of a control (handshake) frame. RTRS
	// over RDMA never uses it.
	ImmCtrl rtrs.ImmType = 15
	// MaxCtrlLen (4096) bounds the payload of a control frame: enough for
	// ConnReq, ConnRsp, InfoReq and an InfoRsp of up to 255 descriptors (a
	// TCP server sends one).
	MaxCtrlLen = 4096
)

// CtrlKind is the payload of a control frame's immediate: which handshake
// message the frame carries.
type CtrlKind uint32

// Control frame kinds.
const (
	// CtrlConnReq (1), client→server: rtrs.ConnReq.
	CtrlConnReq CtrlKind = 1
	// CtrlConnRsp (2), server→client: rtrs.ConnRsp.
	CtrlConnRsp CtrlKind = 2
	// CtrlInfoReq (3), client→server on cid 0: rtrs.InfoReq.
	CtrlInfoReq CtrlKind = 3
	// CtrlInfoRsp (4), server→client on cid 0: rtrs.InfoRsp.
	CtrlInfoRsp CtrlKind = 4
	// CtrlFenceReq (5), client→server on cid 0 of a serving path:
	// rtrs.FenceReq, only to a server that answered rtrs.FlagFence.
	CtrlFenceReq CtrlKind = 5
	// CtrlFenceRsp (6), server→client on that cid 0: rtrs.FenceRsp.
	CtrlFenceRsp CtrlKind = 6
)

// String returns the name of the message the kind carries.
func (k CtrlKind) String() string {
	switch k {
	case CtrlConnReq:
		return "CONN_REQ"
	case CtrlConnRsp:
		return "CONN_RSP"
	case CtrlInfoReq:
		return "INFO_REQ"
	case CtrlInfoRsp:
		return "INFO_RSP"
	case CtrlFenceReq:
		return "FENCE_REQ"
	case CtrlFenceRsp:
		return "FENCE_RSP"
	}
	return fmt.Sprintf("CTRL(%d)", uint32(k))
}

// Imm returns the immediate value of a control frame of kind k.
func (k CtrlKind) Imm() uint32 {
	return uint32(ImmCtrl)<<rtrs.ImmPayloadBits | uint32(k)&rtrs.ImmPayloadMask
}

// Direction says which side receives the frames a Decoder decodes; it
// decides which immediate types and control kinds are allowed.
type Direction uint8

const (
	// ToServer: frames a server receives (IO_REQ, heartbeats, ConnReq,
	// InfoReq).
	ToServer Direction = 1
	// ToClient: frames a client receives (IO_RSP, heartbeats, ConnRsp,
	// InfoRsp).
	ToClient Direction = 2
)

// String returns "to server" or "to client".
func (d Direction) String() string {
	switch d {
	case ToServer:
		return "to server"
	case ToClient:
		return "to client"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// Header is the fixed 12-byte frame header.
type Header struct {
	// Imm is the host-order RTRS immediate (or a control immediate).
	Imm uint32
	// Len is the payload length.
	Len uint32
	// Off is the chunk offset of the payload of an IO_REQ; 0 otherwise.
	Off uint32
}

// MarshalTo writes the header to b and returns HeaderSize. It does not
// validate the header; use the constructors (IOReqHeader, ...) for that.
func (h Header) MarshalTo(b []byte) (int, error) {
	if len(b) < HeaderSize {
		return 0, fmt.Errorf("rtrs/tcp header: buffer has %d bytes, need %d: %w", len(b), HeaderSize, rtrs.ErrShortBuffer)
	}
	binary.LittleEndian.PutUint32(b[0:], h.Imm)
	binary.LittleEndian.PutUint32(b[4:], h.Len)
	binary.LittleEndian.PutUint32(b[8:], h.Off)
	return HeaderSize, nil
}

// Unmarshal reads a header from the first HeaderSize bytes of b. It checks
// only the length of b; a Decoder validates the fields.
func (h *Header) Unmarshal(b []byte) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("rtrs/tcp header: have %d bytes, need %d: %w", len(b), HeaderSize, rtrs.ErrTruncated)
	}
	h.Imm = binary.LittleEndian.Uint32(b[0:])
	h.Len = binary.LittleEndian.Uint32(b[4:])
	h.Off = binary.LittleEndian.Uint32(b[8:])
	return nil
}

// IOReqHeader returns the header of an IO request for chunk bufID laid out
// as l (from rtrs.WriteLayout or rtrs.ReadLayout): the immediate carries
// (bufID, l.HdrOff), the payload is l.WriteLen bytes written at l.WriteOff.
func IOReqHeader(c rtrs.ImmCodec, bufID uint32, l rtrs.IOLayout) (Header, error) {
	imm, err := c.IOReq(bufID, l.HdrOff)
	if err != nil {
		return Header{}, fmt.Errorf("rtrs/tcp io_req frame: %w", err)
	}
	h := Header{Imm: imm, Len: l.WriteLen, Off: l.WriteOff}
	if err := checkIOReq(h, l.HdrOff, uint32(c.ChunkSize())); err != nil {
		return Header{}, err
	}
	return h, nil
}

// IORspHeader returns the header of the response to request msgID with
// errno (0 or negative) carrying dataLen bytes of read data. Only a
// successful response may carry data, at most one chunk.
func IORspHeader(c rtrs.ImmCodec, msgID uint32, errno int, dataLen int) (Header, error) {
	imm, err := c.IORsp(msgID, errno, false)
	if err != nil {
		return Header{}, fmt.Errorf("rtrs/tcp io_rsp frame: %w", err)
	}
	if dataLen < 0 || dataLen > c.ChunkSize() || (errno != 0 && dataLen != 0) {
		return Header{}, frameErr(rtrs.ErrMsgSize, "io_rsp", "data length %d (errno %d, chunk size %d)", dataLen, errno, c.ChunkSize())
	}
	return Header{Imm: imm, Len: uint32(dataLen)}, nil
}

// HeartbeatHeader returns the header of a heartbeat (HB_MSG), or of its
// answer (HB_ACK) if ack is set.
func HeartbeatHeader(ack bool) Header {
	if ack {
		return Header{Imm: rtrs.HeartbeatAckImm}
	}
	return Header{Imm: rtrs.HeartbeatImm}
}

// CtrlHeader returns the header of a control frame of kind k with an n-byte
// payload.
func CtrlHeader(k CtrlKind, n int) (Header, error) {
	if k < CtrlConnReq || k > CtrlFenceRsp {
		return Header{}, frameErr(rtrs.ErrBadType, "ctrl", "unknown kind %d", uint32(k))
	}
	if n < 0 || n > MaxCtrlLen {
		return Header{}, frameErr(rtrs.ErrMsgSize, "ctrl", "%v payload of %d bytes, max %d", k, n, MaxCtrlLen)
	}
	return Header{Imm: k.Imm(), Len: uint32(n)}, nil
}

// checkIOReq checks that an IO_REQ payload fits the chunk and holds the
// RTRS header at hdrOff (at least its 4-byte type/usr_len part).
func checkIOReq(h Header, hdrOff, chunkSize uint32) error {
	end := uint64(h.Off) + uint64(h.Len)
	if end > uint64(chunkSize) {
		return frameErr(rtrs.ErrMsgSize, "io_req", "payload [%d,%d) outside chunk of %d bytes", h.Off, end, chunkSize)
	}
	if hdrOff < h.Off || uint64(hdrOff)+rtrs.RdmaWriteMsgSize > end {
		return frameErr(rtrs.ErrOutOfRange, "io_req", "header offset %d not inside payload [%d,%d)", hdrOff, h.Off, end)
	}
	return nil
}

// frameErr wraps sentinel with the frame name and a description; error path
// only (it allocates).
func frameErr(sentinel error, frame, format string, args ...any) error {
	return fmt.Errorf("rtrs/tcp %s frame: %s: %w", frame, fmt.Sprintf(format, args...), sentinel)
}
