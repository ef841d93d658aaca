package rtrs

import "encoding/binary"

// MsgFenceReq and MsgFenceRsp are the types of the urnbd fence messages;
// the kernel's RTRS has no such messages (its types end at 5).
const (
	MsgFenceReq MsgType = 0x7501
	MsgFenceRsp MsgType = 0x7502
)

// FenceReq (20 bytes, a urnbd extension) asks the server, on a path that
// serves, to close another path of the same session now, so that none of
// the requests it still has unread ever starts; the client resends that
// path's requests elsewhere only once the FenceRsp arrived. Only sent to
// a server that answered FlagFence.
//
//	off 0  le16  type       MsgFenceReq
//	off 2  le16  reserved
//	off 4  16    sess_uuid  the path to close
type FenceReq struct {
	SessUUID UUID
}

// Size returns FenceReqSize.
func (m *FenceReq) Size() int { return FenceReqSize }

// MarshalTo writes the request to b and returns FenceReqSize.
func (m *FenceReq) MarshalTo(b []byte) (int, error) {
	if len(b) < FenceReqSize {
		return 0, errShortBuffer("fence_req", len(b), FenceReqSize)
	}
	b = b[:FenceReqSize]
	clear(b)
	binary.LittleEndian.PutUint16(b, uint16(MsgFenceReq))
	copy(b[4:], m.SessUUID[:])
	return FenceReqSize, nil
}

// Unmarshal decodes a request: at least FenceReqSize bytes (ErrTruncated),
// type MsgFenceReq (ErrBadType).
func (m *FenceReq) Unmarshal(b []byte) error {
	if len(b) < FenceReqSize {
		return errTruncated("fence_req", len(b), FenceReqSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgFenceReq {
		return wireErr(ErrBadType, "fence_req", "type %#04x, want %#04x", uint16(t), uint16(MsgFenceReq))
	}
	copy(m.SessUUID[:], b[4:20])
	return nil
}

// FenceRsp (20 bytes, a urnbd extension) answers a FenceReq once the
// path is closed (errno 0; also when the server had no such path left),
// or with a negative errno.
//
//	off 0  le16  type       MsgFenceRsp
//	off 2  le16  errno      0 or a negative errno (s16)
//	off 4  16    sess_uuid  the path of the request
type FenceRsp struct {
	Errno    int16
	SessUUID UUID
}

// Size returns FenceRspSize.
func (m *FenceRsp) Size() int { return FenceRspSize }

// MarshalTo writes the answer to b and returns FenceRspSize. An Errno
// above 0 is refused (ErrOutOfRange).
func (m *FenceRsp) MarshalTo(b []byte) (int, error) {
	if len(b) < FenceRspSize {
		return 0, errShortBuffer("fence_rsp", len(b), FenceRspSize)
	}
	if m.Errno > 0 {
		return 0, wireErr(ErrOutOfRange, "fence_rsp", "errno %d > 0", m.Errno)
	}
	b = b[:FenceRspSize]
	clear(b)
	binary.LittleEndian.PutUint16(b, uint16(MsgFenceRsp))
	binary.LittleEndian.PutUint16(b[2:], uint16(m.Errno))
	copy(b[4:], m.SessUUID[:])
	return FenceRspSize, nil
}

// Unmarshal decodes an answer: at least FenceRspSize bytes (ErrTruncated),
// type MsgFenceRsp (ErrBadType), errno <= 0 (ErrOutOfRange).
func (m *FenceRsp) Unmarshal(b []byte) error {
	if len(b) < FenceRspSize {
		return errTruncated("fence_rsp", len(b), FenceRspSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgFenceRsp {
		return wireErr(ErrBadType, "fence_rsp", "type %#04x, want %#04x", uint16(t), uint16(MsgFenceRsp))
	}
	errno := int16(binary.LittleEndian.Uint16(b[2:]))
	if errno > 0 {
		return wireErr(ErrOutOfRange, "fence_rsp", "errno %d > 0", errno)
	}
	m.Errno = errno
	copy(m.SessUUID[:], b[4:20])
	return nil
}
