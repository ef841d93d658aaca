package rnbd

// SessInfo is rnbd_msg_sess_info (36 bytes), the first RNBD message of a
// session, sent by the client as an RTRS READ with a 36-byte reply buffer:
//
//	off 0  4   hdr       type MsgSessInfo (0)
//	off 4  u8  ver       client protocol major version (ProtoVerMajor)
//	off 5  31  reserved
type SessInfo struct {
	// Ver is the client's RNBD major version.
	Ver uint8
}

// Size returns SessInfoSize.
func (m *SessInfo) Size() int { return SessInfoSize }

// MarshalTo writes the 36-byte message to b and returns 36.
func (m *SessInfo) MarshalTo(b []byte) (int, error) {
	return marshalVer(b, MsgSessInfo, m.Ver, "sess_info")
}

// Unmarshal decodes the message from b: at least 36 bytes (ErrTruncated),
// type MsgSessInfo (ErrBadType). Any version is accepted; the server runs the
// session at min(Ver, ProtoVerMajor).
func (m *SessInfo) Unmarshal(b []byte) error {
	if err := checkHdr(b, MsgSessInfo, SessInfoSize, "sess_info"); err != nil {
		return err
	}
	m.Ver = b[4]
	return nil
}

// SessInfoRsp is rnbd_msg_sess_info_rsp (36 bytes), the server's reply to
// SessInfo, written into the client's READ buffer:
//
//	off 0  4   hdr       type MsgSessInfoRsp (1)
//	off 4  u8  ver       session version: min(client ver, server ver)
//	off 5  31  reserved
type SessInfoRsp struct {
	// Ver is the version the server runs the session at; the client uses
	// min(Ver, its own).
	Ver uint8
}

// Size returns SessInfoRspSize.
func (m *SessInfoRsp) Size() int { return SessInfoRspSize }

// MarshalTo writes the 36-byte message to b and returns 36.
func (m *SessInfoRsp) MarshalTo(b []byte) (int, error) {
	return marshalVer(b, MsgSessInfoRsp, m.Ver, "sess_info_rsp")
}

// Unmarshal decodes the message from b: at least 36 bytes (ErrTruncated),
// type MsgSessInfoRsp (ErrBadType).
func (m *SessInfoRsp) Unmarshal(b []byte) error {
	if err := checkHdr(b, MsgSessInfoRsp, SessInfoRspSize, "sess_info_rsp"); err != nil {
		return err
	}
	m.Ver = b[4]
	return nil
}

func marshalVer(b []byte, t MsgType, ver uint8, name string) (int, error) {
	if len(b) < SessInfoSize {
		return 0, errShortBuffer(name, len(b), SessInfoSize)
	}
	b = b[:SessInfoSize]
	clear(b)
	putHdr(b, t)
	b[4] = ver
	return SessInfoSize, nil
}
