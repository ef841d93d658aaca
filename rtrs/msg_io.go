package rtrs

import "encoding/binary"

// RdmaWriteMsg is rtrs_msg_rdma_write (4 bytes), the RTRS header of a write
// request (data client→server). In the chunk it follows the user message,
// which follows the data:
//
//	off 0  le16  type     MsgWrite (2)
//	off 2  le16  usr_len  length of the user message before this header
type RdmaWriteMsg struct {
	// UsrLen is the length of the user (RNBD) message that precedes the
	// header in the chunk.
	UsrLen uint16
}

// Size returns RdmaWriteMsgSize.
func (m *RdmaWriteMsg) Size() int { return RdmaWriteMsgSize }

// MarshalTo writes the 4-byte header to b and returns 4.
func (m *RdmaWriteMsg) MarshalTo(b []byte) (int, error) {
	if len(b) < RdmaWriteMsgSize {
		return 0, errShortBuffer("rdma_write", len(b), RdmaWriteMsgSize)
	}
	binary.LittleEndian.PutUint16(b[0:], uint16(MsgWrite))
	binary.LittleEndian.PutUint16(b[2:], m.UsrLen)
	return RdmaWriteMsgSize, nil
}

// Unmarshal decodes the header from b: at least 4 bytes (ErrTruncated),
// type MsgWrite (ErrBadType).
func (m *RdmaWriteMsg) Unmarshal(b []byte) error {
	if len(b) < RdmaWriteMsgSize {
		return errTruncated("rdma_write", len(b), RdmaWriteMsgSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgWrite {
		return wireErr(ErrBadType, "rdma_write", "type %v, want %v", t, MsgWrite)
	}
	m.UsrLen = binary.LittleEndian.Uint16(b[2:])
	return nil
}

// RdmaReadMsg is rtrs_msg_rdma_read (8 + 16·sg_cnt bytes), the RTRS header
// of a read request (data server→client). In the chunk it follows the user
// message, which follows the space reserved for the data:
//
//	off 0  le16  type     MsgRead (3)
//	off 2  le16  usr_len  length of the user message before this header
//	off 4  le16  flags    FlagNeedInval
//	off 6  le16  sg_cnt   number of descriptors (0 or 1 from a 6.12 client)
//	off 8  16·n  desc[]   client buffers the server RDMA-writes the data to
type RdmaReadMsg struct {
	// UsrLen is the length of the user message that precedes the header.
	UsrLen uint16
	// Flags holds FlagNeedInval when the server must invalidate Desc[0].Key
	// with a SEND_WITH_INV before answering. Unknown bits are kept.
	Flags uint16
	// Desc lists the client buffers (0..65535 entries, each Len non-zero).
	// A request without data (e.g. a flush) has none.
	Desc []SGDesc
}

// Size returns the encoded size, 8 + 16·len(m.Desc).
func (m *RdmaReadMsg) Size() int { return RdmaReadHdrSize + SGDescSize*len(m.Desc) }

// MarshalTo writes the header and its descriptors to b and returns the
// size. It fails if Desc has more than 65535 entries or a zero Len.
func (m *RdmaReadMsg) MarshalTo(b []byte) (int, error) {
	n := len(m.Desc)
	if n > 0xFFFF {
		return 0, wireErr(ErrOutOfRange, "rdma_read", "sg_cnt %d exceeds 65535", n)
	}
	size := m.Size()
	if len(b) < size {
		return 0, errShortBuffer("rdma_read", len(b), size)
	}
	for i := range m.Desc {
		if m.Desc[i].Len == 0 {
			return 0, wireErr(ErrOutOfRange, "rdma_read", "desc[%d].len is 0", i)
		}
	}
	binary.LittleEndian.PutUint16(b[0:], uint16(MsgRead))
	binary.LittleEndian.PutUint16(b[2:], m.UsrLen)
	binary.LittleEndian.PutUint16(b[4:], m.Flags)
	binary.LittleEndian.PutUint16(b[6:], uint16(n))
	putDescs(b[RdmaReadHdrSize:], m.Desc)
	return size, nil
}

// Unmarshal decodes the header from b: at least 8+16·sg_cnt bytes
// (ErrTruncated), type MsgRead (ErrBadType), every descriptor len non-zero
// (ErrOutOfRange; the kernel server closes the path on a zero length). The
// descriptors are decoded into m.Desc reusing its capacity, so decoding into
// a kept RdmaReadMsg with cap(Desc) >= sg_cnt does not allocate. The limit
// of the kernel server (sg_cnt <= ServerMaxReadSGCnt) is not applied here.
func (m *RdmaReadMsg) Unmarshal(b []byte) error {
	if len(b) < RdmaReadHdrSize {
		return errTruncated("rdma_read", len(b), RdmaReadHdrSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgRead {
		return wireErr(ErrBadType, "rdma_read", "type %v, want %v", t, MsgRead)
	}
	n := int(binary.LittleEndian.Uint16(b[6:]))
	if size := RdmaReadHdrSize + SGDescSize*n; len(b) < size {
		return wireErr(ErrTruncated, "rdma_read", "sg_cnt %d needs %d bytes, have %d", n, size, len(b))
	}
	d := b[RdmaReadHdrSize:]
	for i := 0; i < n; i++ {
		if binary.LittleEndian.Uint32(d[i*SGDescSize+12:]) == 0 {
			return wireErr(ErrOutOfRange, "rdma_read", "desc[%d].len is 0", i)
		}
	}
	m.UsrLen = binary.LittleEndian.Uint16(b[2:])
	m.Flags = binary.LittleEndian.Uint16(b[4:])
	m.Desc = getDescs(m.Desc, d, n)
	return nil
}

// RkeyRsp is rtrs_msg_rkey_rsp (8 bytes), sent by a server that advertised
// FlagNewRkey as the payload of the SEND-with-IMM whose immediate is the IO
// response; it carries the chunk's rkey for the next request:
//
//	off 0  le16  type    MsgRkeyRsp (4)
//	off 2  le16  buf_id  chunk index (must equal the msg_id of the immediate)
//	off 4  le32  rkey    new rkey of that chunk
type RkeyRsp struct {
	// BufID is the chunk index whose rkey changed.
	BufID uint16
	// RKey is the chunk's new rkey.
	RKey uint32
}

// Size returns RkeyRspSize.
func (m *RkeyRsp) Size() int { return RkeyRspSize }

// MarshalTo writes the 8-byte message to b and returns 8.
func (m *RkeyRsp) MarshalTo(b []byte) (int, error) {
	if len(b) < RkeyRspSize {
		return 0, errShortBuffer("rkey_rsp", len(b), RkeyRspSize)
	}
	binary.LittleEndian.PutUint16(b[0:], uint16(MsgRkeyRsp))
	binary.LittleEndian.PutUint16(b[2:], m.BufID)
	binary.LittleEndian.PutUint32(b[4:], m.RKey)
	return RkeyRspSize, nil
}

// Unmarshal decodes the message from b: at least 8 bytes (ErrTruncated),
// type MsgRkeyRsp (ErrBadType). The caller checks BufID against the queue
// depth and the immediate's msg_id (CheckBufID).
func (m *RkeyRsp) Unmarshal(b []byte) error {
	if len(b) < RkeyRspSize {
		return errTruncated("rkey_rsp", len(b), RkeyRspSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgRkeyRsp {
		return wireErr(ErrBadType, "rkey_rsp", "type %v, want %v", t, MsgRkeyRsp)
	}
	m.BufID = binary.LittleEndian.Uint16(b[2:])
	m.RKey = binary.LittleEndian.Uint32(b[4:])
	return nil
}

// CheckBufID applies the kernel client's checks to a received RKEY_RSP:
// BufID < queueDepth and BufID == msgID, the id of the IO response immediate
// that carried it. Failures wrap ErrOutOfRange.
func (m *RkeyRsp) CheckBufID(queueDepth int, msgID uint32) error {
	if int(m.BufID) >= queueDepth {
		return wireErr(ErrOutOfRange, "rkey_rsp", "buf_id %d >= queue depth %d", m.BufID, queueDepth)
	}
	if uint32(m.BufID) != msgID {
		return wireErr(ErrOutOfRange, "rkey_rsp", "buf_id %d != msg_id %d of the immediate", m.BufID, msgID)
	}
	return nil
}

// IOLayout says where the parts of one IO request go in a server chunk.
// The RTRS header is not at the end of the chunk: data always starts at
// offset 0, the user message follows the data, the RTRS header follows the
// user message:
//
//	WRITE: [0,D) data | [D,D+U) user msg | [D+U,D+U+4) RdmaWriteMsg
//	READ:  [0,D) room for the reply | [D,D+U) user msg | [D+U,...) RdmaReadMsg + descs
//
// A WRITE is one RDMA-WRITE-with-IMM to the chunk base gathering the data
// and the header part; a READ is one RDMA-WRITE-with-IMM of the header part
// only, to chunk base + D. The immediate is IO_REQ with offset D+U.
type IOLayout struct {
	// Type is MsgWrite or MsgRead.
	Type MsgType
	// DataLen (D) is the data length: the bytes written for a WRITE, the
	// bytes to be read for a READ.
	DataLen uint32
	// UsrLen (U) is the user message length.
	UsrLen uint32
	// SGCnt is the number of READ descriptors (0 for WRITE).
	SGCnt int
	// HdrOff (D+U) is the chunk offset of the RTRS header, the offset
	// carried in the IO_REQ immediate.
	HdrOff uint32
	// HdrLen is the length of the header part: user message + RTRS header
	// (+ descriptors), i.e. U+4 or U+8+16·SGCnt.
	HdrLen uint32
	// WriteOff is the chunk offset where the RDMA write starts: 0 for WRITE,
	// D for READ.
	WriteOff uint32
	// WriteLen is the number of bytes RDMA-written: D+HdrLen for WRITE,
	// HdrLen for READ.
	WriteLen uint32
}

// UsrOff returns the chunk offset of the user message, DataLen.
func (l IOLayout) UsrOff() uint32 { return l.DataLen }

// WriteLayout computes the layout of a write request with dataLen data
// bytes and a usrLen-byte user message for a server with the given chunk and
// header sizes (from ConnRsp). As the kernel client, it fails with
// ErrMsgSize if U+4 > maxHdrSize or D+U+4 > chunkSize; negative lengths or
// usrLen > 65535 wrap ErrOutOfRange.
func WriteLayout(dataLen, usrLen int, chunkSize, maxHdrSize uint32) (IOLayout, error) {
	return newLayout(MsgWrite, dataLen, usrLen, 0, chunkSize, maxHdrSize)
}

// ReadLayout computes the layout of a read request reading dataLen bytes
// into sgCnt client buffers with a usrLen-byte user message. It fails with
// ErrMsgSize if U+8+16·sgCnt > maxHdrSize or D+U+8+16·sgCnt > chunkSize (the
// 6.12 client counts only the fixed 8 header bytes against the chunk; with
// D <= max_io_size both agree).
func ReadLayout(dataLen, usrLen, sgCnt int, chunkSize, maxHdrSize uint32) (IOLayout, error) {
	return newLayout(MsgRead, dataLen, usrLen, sgCnt, chunkSize, maxHdrSize)
}

func newLayout(t MsgType, dataLen, usrLen, sgCnt int, chunkSize, maxHdrSize uint32) (IOLayout, error) {
	name := "write layout"
	if t == MsgRead {
		name = "read layout"
	}
	if dataLen < 0 || uint64(dataLen) > uint64(chunkSize) {
		return IOLayout{}, wireErr(ErrMsgSize, name, "data length %d exceeds chunk size %d", dataLen, chunkSize)
	}
	if usrLen < 0 || usrLen > 0xFFFF {
		return IOLayout{}, wireErr(ErrOutOfRange, name, "user message length %d not in 0..65535", usrLen)
	}
	if sgCnt < 0 || sgCnt > 0xFFFF {
		return IOLayout{}, wireErr(ErrOutOfRange, name, "sg_cnt %d not in 0..65535", sgCnt)
	}
	hdr := uint64(usrLen) + RdmaWriteMsgSize
	if t == MsgRead {
		hdr = uint64(usrLen) + RdmaReadHdrSize + SGDescSize*uint64(sgCnt)
	}
	if hdr > uint64(maxHdrSize) {
		return IOLayout{}, wireErr(ErrMsgSize, name, "user message %d + header = %d bytes exceeds max_hdr_size %d", usrLen, hdr, maxHdrSize)
	}
	if uint64(dataLen)+hdr > uint64(chunkSize) {
		return IOLayout{}, wireErr(ErrMsgSize, name, "data %d + header part %d exceeds chunk size %d", dataLen, hdr, chunkSize)
	}
	l := IOLayout{
		Type:     t,
		DataLen:  uint32(dataLen),
		UsrLen:   uint32(usrLen),
		SGCnt:    sgCnt,
		HdrOff:   uint32(dataLen + usrLen),
		HdrLen:   uint32(hdr),
		WriteLen: uint32(uint64(dataLen) + hdr),
	}
	if t == MsgRead {
		l.WriteOff = uint32(dataLen)
		l.WriteLen = uint32(hdr)
	}
	return l, nil
}

// PutWriteReq writes a complete write request into chunk as the server will
// hold it (data at 0, user message, RdmaWriteMsg) and returns the header
// offset for the IO_REQ immediate. It is meant for transports that copy
// (TCP) and for tests; an RDMA client instead marshals the user message and
// RdmaWriteMsg into its header buffer and gathers it after the data.
func PutWriteReq(chunk, data, usr []byte) (off uint32, err error) {
	if len(usr) > 0xFFFF {
		return 0, wireErr(ErrOutOfRange, "write request", "user message length %d exceeds 65535", len(usr))
	}
	need := len(data) + len(usr) + RdmaWriteMsgSize
	if len(chunk) < need {
		return 0, wireErr(ErrMsgSize, "write request", "needs %d bytes, chunk has %d", need, len(chunk))
	}
	copy(chunk, data)
	copy(chunk[len(data):], usr)
	off = uint32(len(data) + len(usr))
	h := RdmaWriteMsg{UsrLen: uint16(len(usr))}
	if _, err := h.MarshalTo(chunk[off:]); err != nil {
		return 0, err
	}
	return off, nil
}

// PutReadReq writes the header part of a read request into chunk as the
// server will hold it (user message at dataLen, then the RdmaReadMsg with
// flags and descs) and returns the header offset for the IO_REQ immediate.
// The first dataLen bytes of chunk are left untouched.
func PutReadReq(chunk []byte, dataLen int, usr []byte, flags uint16, descs []SGDesc) (off uint32, err error) {
	if len(usr) > 0xFFFF {
		return 0, wireErr(ErrOutOfRange, "read request", "user message length %d exceeds 65535", len(usr))
	}
	h := RdmaReadMsg{UsrLen: uint16(len(usr)), Flags: flags, Desc: descs}
	if dataLen < 0 {
		return 0, wireErr(ErrOutOfRange, "read request", "data length %d is negative", dataLen)
	}
	need := dataLen + len(usr) + h.Size()
	if len(chunk) < need {
		return 0, wireErr(ErrMsgSize, "read request", "needs %d bytes, chunk has %d", need, len(chunk))
	}
	copy(chunk[dataLen:], usr)
	off = uint32(dataLen + len(usr))
	if _, err := h.MarshalTo(chunk[off:]); err != nil {
		return 0, err
	}
	return off, nil
}

// IOReq is an IO request as found in a server chunk, the result of
// ParseIOReq. Its slices alias the chunk.
type IOReq struct {
	// Type is MsgWrite or MsgRead.
	Type MsgType
	// Off is the chunk offset of the RTRS header (from the immediate).
	Off uint32
	// Data is chunk[0 : Off-UsrLen]: the written data of a WRITE; for a
	// READ the room the reply may be built in. Its capacity is limited to
	// its length.
	Data []byte
	// Usr is the user (RNBD) message, chunk[Off-UsrLen : Off].
	Usr []byte
	// Flags are the READ header flags (FlagNeedInval); 0 for WRITE.
	Flags uint16
	// Descs are the READ descriptors in place; empty for WRITE.
	Descs SGDescs
}

// ParseIOReq parses the request in chunk (the server's whole chunk, so
// len(chunk) is the chunk size) whose RTRS header is at off, the offset of
// the IO_REQ immediate. It never reads outside chunk and does not allocate
// on success. It fails with
//   - ErrOutOfRange if off >= len(chunk), if usr_len > off (the kernel
//     drops such a request silently), or if a READ descriptor has len 0 or
//     len > len(chunk) (the kernel closes the path);
//   - ErrTruncated if the header or the descriptors run past the chunk;
//   - ErrBadType if the type is neither MsgWrite nor MsgRead (the kernel
//     closes the path).
//
// It does not enforce ServerMaxReadSGCnt; a server compatible with the
// kernel drops READs with more descriptors.
func ParseIOReq(chunk []byte, off uint32) (IOReq, error) {
	if uint64(off) >= uint64(len(chunk)) {
		return IOReq{}, wireErr(ErrOutOfRange, "io_req", "header offset %d outside chunk of %d bytes", off, len(chunk))
	}
	h := chunk[off:]
	if len(h) < 2 {
		return IOReq{}, errTruncated("io_req", len(h), 2)
	}
	r := IOReq{Type: MsgType(binary.LittleEndian.Uint16(h)), Off: off}
	var hdrEnd int
	switch r.Type {
	case MsgWrite:
		if len(h) < RdmaWriteMsgSize {
			return IOReq{}, wireErr(ErrTruncated, "io_req", "write header at %d needs %d bytes, chunk has %d left", off, RdmaWriteMsgSize, len(h))
		}
		hdrEnd = RdmaWriteMsgSize
	case MsgRead:
		if len(h) < RdmaReadHdrSize {
			return IOReq{}, wireErr(ErrTruncated, "io_req", "read header at %d needs %d bytes, chunk has %d left", off, RdmaReadHdrSize, len(h))
		}
		n := int(binary.LittleEndian.Uint16(h[6:]))
		hdrEnd = RdmaReadHdrSize + SGDescSize*n
		if len(h) < hdrEnd {
			return IOReq{}, wireErr(ErrTruncated, "io_req", "read header at %d with sg_cnt %d needs %d bytes, chunk has %d left", off, n, hdrEnd, len(h))
		}
		r.Flags = binary.LittleEndian.Uint16(h[4:])
		r.Descs = SGDescs(h[RdmaReadHdrSize:hdrEnd:hdrEnd])
		for i := 0; i < n; i++ {
			l := binary.LittleEndian.Uint32(r.Descs[i*SGDescSize+12:])
			if l == 0 || uint64(l) > uint64(len(chunk)) {
				return IOReq{}, wireErr(ErrOutOfRange, "io_req", "desc[%d].len %d not in 1..%d", i, l, len(chunk))
			}
		}
	default:
		return IOReq{}, wireErr(ErrBadType, "io_req", "type %v at offset %d, want %v or %v", r.Type, off, MsgWrite, MsgRead)
	}
	usrLen := uint32(binary.LittleEndian.Uint16(h[2:]))
	if usrLen > off {
		return IOReq{}, wireErr(ErrOutOfRange, "io_req", "usr_len %d > header offset %d", usrLen, off)
	}
	d := off - usrLen
	r.Data = chunk[:d:d]
	r.Usr = chunk[d:off:off]
	return r, nil
}
