package frame

import (
	"fmt"

	"github.com/urnbd/urnbd/rtrs"
)

// PutFrame writes header h and payload into b as one frame and returns its
// size, HeaderSize+len(payload). len(payload) must equal h.Len. It does not
// allocate; a sender that wants to avoid the copy writes the header and the
// payload parts with one writev instead.
func PutFrame(b []byte, h Header, payload []byte) (int, error) {
	if uint64(len(payload)) != uint64(h.Len) {
		return 0, frameErr(rtrs.ErrOutOfRange, "encode", "payload of %d bytes, header says %d", len(payload), h.Len)
	}
	n := HeaderSize + len(payload)
	if len(b) < n {
		return 0, frameErr(rtrs.ErrShortBuffer, "encode", "buffer of %d bytes, need %d", len(b), n)
	}
	_, _ = h.MarshalTo(b)
	copy(b[HeaderSize:], payload)
	return n, nil
}

// Marshaler is the encoding half of every rtrs wire message.
type Marshaler interface {
	Size() int
	MarshalTo(b []byte) (int, error)
}

// PutCtrl encodes m as a control frame of kind k into b and returns the frame
// size.
func PutCtrl(b []byte, k CtrlKind, m Marshaler) (int, error) {
	h, err := CtrlHeader(k, m.Size())
	if err != nil {
		return 0, err
	}
	if len(b) < HeaderSize+m.Size() {
		return 0, frameErr(rtrs.ErrShortBuffer, "encode", "buffer of %d bytes, need %d", len(b), HeaderSize+m.Size())
	}
	n, err := m.MarshalTo(b[HeaderSize:])
	if err != nil {
		return 0, fmt.Errorf("rtrs/tcp %v frame: %w", k, err)
	}
	h.Len = uint32(n)
	_, _ = h.MarshalTo(b)
	return HeaderSize + n, nil
}
