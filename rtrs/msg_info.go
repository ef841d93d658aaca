package rtrs

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// InfoReq is rtrs_msg_info_req (272 bytes), sent by the client as a plain
// SEND on connection 0 once all connections of a path are established:
//
//	off 0   le16  type      MsgInfoReq (0)
//	off 2   255   pathname  session name, NUL-terminated and NUL-padded
//	off 257 15    reserved
//
// The server uses the name as its session name (and RNBD's %SESSNAME%).
// On a path that authenticates (auth.go), the client appends a trailer:
//
//	off 272 le32  magic   InfoAuthMagic
//	off 276 16    client nonce
//	off 292 32    client proof (PathAuth.ClientProof)
type InfoReq struct {
	// Name holds the session name, NUL-terminated: at most PathNameLen-1
	// bytes, then zeros. Use SetName and NameBytes.
	Name [PathNameLen]byte
	// Auth says the trailer is present (sent, or received).
	Auth        bool
	ClientNonce [NonceSize]byte
	Proof       [PathProofSize]byte
}

// Size returns InfoReqSize, plus InfoReqAuthSize with Auth.
func (m *InfoReq) Size() int {
	if m.Auth {
		return InfoReqSize + InfoReqAuthSize
	}
	return InfoReqSize
}

// SetName stores name in m.Name. It fails if name is longer than
// PathNameLen-1 bytes or contains a NUL; it does not apply CheckSessName.
func (m *InfoReq) SetName(name string) error {
	if len(name) > PathNameLen-1 {
		return wireErr(ErrOutOfRange, "info_req", "name length %d exceeds %d", len(name), PathNameLen-1)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return wireErr(ErrOutOfRange, "info_req", "name %q contains NUL", name)
	}
	m.Name = [PathNameLen]byte{}
	copy(m.Name[:], name)
	return nil
}

// NameBytes returns the session name (the bytes before the first NUL), a
// slice of m.Name.
func (m *InfoReq) NameBytes() []byte {
	if i := bytes.IndexByte(m.Name[:], 0); i >= 0 {
		return m.Name[:i]
	}
	return m.Name[:]
}

// NameString returns the session name as a string.
func (m *InfoReq) NameString() string { return string(m.NameBytes()) }

func (m *InfoReq) nameLen() (int, error) {
	i := bytes.IndexByte(m.Name[:], 0)
	if i < 0 {
		return 0, wireErr(ErrOutOfRange, "info_req", "pathname not NUL-terminated within %d bytes", PathNameLen)
	}
	return i, nil
}

// MarshalTo writes the request (272 bytes, and the trailer with Auth) to b
// and returns its size. Bytes of m.Name after the terminating NUL are
// written as zeros. It fails if Name is not NUL-terminated.
func (m *InfoReq) MarshalTo(b []byte) (int, error) {
	size := m.Size()
	if len(b) < size {
		return 0, errShortBuffer("info_req", len(b), size)
	}
	n, err := m.nameLen()
	if err != nil {
		return 0, err
	}
	b = b[:size]
	clear(b)
	binary.LittleEndian.PutUint16(b[0:], uint16(MsgInfoReq))
	copy(b[2:], m.Name[:n])
	if m.Auth {
		t := b[InfoReqSize:]
		binary.LittleEndian.PutUint32(t, InfoAuthMagic)
		copy(t[4:], m.ClientNonce[:])
		copy(t[4+NonceSize:], m.Proof[:])
	}
	return size, nil
}

// Unmarshal decodes a request from b: at least 272 bytes (ErrTruncated, the
// kernel server checks the received length), type MsgInfoReq (ErrBadType),
// and a name NUL-terminated within its 255 bytes (ErrOutOfRange; the kernel
// client never sends more than 254 name bytes). The name is not checked with
// CheckSessName; bytes after its NUL are dropped. A trailer (InfoAuthMagic
// and its full size) sets Auth; other bytes after the first 272 are
// ignored.
func (m *InfoReq) Unmarshal(b []byte) error {
	if len(b) < InfoReqSize {
		return errTruncated("info_req", len(b), InfoReqSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgInfoReq {
		return wireErr(ErrBadType, "info_req", "type %v, want %v", t, MsgInfoReq)
	}
	f := b[2 : 2+PathNameLen]
	n := bytes.IndexByte(f, 0)
	if n < 0 {
		return wireErr(ErrOutOfRange, "info_req", "pathname not NUL-terminated within %d bytes", PathNameLen)
	}
	*m = InfoReq{}
	copy(m.Name[:], f[:n])
	if t := b[InfoReqSize:]; len(t) >= InfoReqAuthSize && binary.LittleEndian.Uint32(t) == InfoAuthMagic {
		m.Auth = true
		copy(m.ClientNonce[:], t[4:])
		copy(m.Proof[:], t[4+NonceSize:])
	}
	return nil
}

// InfoRsp is rtrs_msg_info_rsp (8 + 16·sg_cnt bytes), the server's answer to
// InfoReq (a SEND on connection 0), describing the memory regions that cover
// its queue_depth chunks:
//
//	off 0  le16  type     MsgInfoRsp (1)
//	off 2  le16  sg_cnt   number of descriptors, >= 1
//	off 4  4     reserved
//	off 8  16·n  desc[]   one per MR: addr = IOVA, key = rkey, len = bytes
//
// With always_invalidate a kernel server sends one MR per chunk; otherwise
// a few MRs holding several chunks each. On a path that authenticates, the
// server appends a trailer after the descriptors: le32 InfoAuthMagic and
// its proof (PathAuth.ServerProof).
type InfoRsp struct {
	// Desc holds the MR descriptors in chunk order; 1..65535 entries, each
	// with a non-zero Len.
	Desc []SGDesc
	// Auth says the trailer is present; Proof is the server's proof.
	Auth  bool
	Proof [PathProofSize]byte
}

// InfoRspBufSize returns the size of the receive buffer a client posts for
// the INFO_RSP of a session with queueDepth chunks, 8 + 16·queueDepth (a
// server never sends more descriptors than chunks), and the trailer.
func InfoRspBufSize(queueDepth int) int {
	return InfoRspHdrSize + SGDescSize*queueDepth + InfoRspAuthSize
}

// Size returns the encoded size, 8 + 16·len(m.Desc), plus InfoRspAuthSize
// with Auth.
func (m *InfoRsp) Size() int {
	n := InfoRspHdrSize + SGDescSize*len(m.Desc)
	if m.Auth {
		n += InfoRspAuthSize
	}
	return n
}

// MarshalTo writes the response to b and returns its size. It fails if Desc
// is empty, longer than 65535 or holds a zero-length descriptor.
func (m *InfoRsp) MarshalTo(b []byte) (int, error) {
	n := len(m.Desc)
	if n == 0 || n > 0xFFFF {
		return 0, wireErr(ErrOutOfRange, "info_rsp", "sg_cnt %d not in 1..65535", n)
	}
	size := m.Size()
	if len(b) < size {
		return 0, errShortBuffer("info_rsp", len(b), size)
	}
	for i := range m.Desc {
		if m.Desc[i].Len == 0 {
			return 0, wireErr(ErrOutOfRange, "info_rsp", "desc[%d].len is 0", i)
		}
	}
	binary.LittleEndian.PutUint16(b[0:], uint16(MsgInfoRsp))
	binary.LittleEndian.PutUint16(b[2:], uint16(n))
	clear(b[4:8])
	putDescs(b[InfoRspHdrSize:], m.Desc)
	if m.Auth {
		t := b[InfoRspHdrSize+SGDescSize*n:]
		binary.LittleEndian.PutUint32(t, InfoAuthMagic)
		copy(t[4:], m.Proof[:])
	}
	return size, nil
}

// Unmarshal decodes a response from b with the kernel client's structural
// checks: at least 8 bytes and at least 8+16·sg_cnt bytes (ErrTruncated),
// type MsgInfoRsp (ErrBadType), sg_cnt != 0 and every len != 0
// (ErrOutOfRange). The descriptors are decoded into m.Desc, reusing its
// capacity: a caller that keeps m and decodes repeatedly does not allocate
// once the capacity suffices. Checks that need the session parameters are
// in ChunkBufs.
func (m *InfoRsp) Unmarshal(b []byte) error {
	if len(b) < InfoRspHdrSize {
		return errTruncated("info_rsp", len(b), InfoRspHdrSize)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != MsgInfoRsp {
		return wireErr(ErrBadType, "info_rsp", "type %v, want %v", t, MsgInfoRsp)
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if n == 0 {
		return wireErr(ErrOutOfRange, "info_rsp", "sg_cnt is 0")
	}
	if size := InfoRspHdrSize + SGDescSize*n; len(b) < size {
		return wireErr(ErrTruncated, "info_rsp", "sg_cnt %d needs %d bytes, have %d", n, size, len(b))
	}
	d := b[InfoRspHdrSize:]
	for i := 0; i < n; i++ {
		if binary.LittleEndian.Uint32(d[i*SGDescSize+12:]) == 0 {
			return wireErr(ErrOutOfRange, "info_rsp", "desc[%d].len is 0", i)
		}
	}
	m.Desc = getDescs(m.Desc, d, n)
	m.Auth, m.Proof = false, [PathProofSize]byte{}
	if t := d[SGDescSize*n:]; len(t) >= InfoRspAuthSize && binary.LittleEndian.Uint32(t) == InfoAuthMagic {
		m.Auth = true
		copy(m.Proof[:], t[4:])
	}
	return nil
}

// RemoteChunk is the client's view of one server chunk: where to
// RDMA-write a request for that buffer id.
type RemoteChunk struct {
	// Addr is the remote address of the chunk's first byte.
	Addr uint64
	// RKey is the rkey to use; with FlagNewRkey it is replaced by every
	// RKEY_RSP for this chunk.
	RKey uint32
}

// ChunkBufs maps the descriptors to queueDepth chunks of chunkSize bytes
// with the kernel client's rules and appends them to dst[:0]: queueDepth
// must be a multiple of the number of descriptors, every len a non-zero
// multiple of chunkSize, and the descriptors must cover exactly queueDepth
// chunks; chunk i of a descriptor is at desc.Addr + i·chunkSize with
// desc.Key. It also requires CheckImmFit(queueDepth, chunkSize); the 6.12
// client checks that fit with sg_cnt in place of queueDepth, which is weaker.
// Failures wrap ErrOutOfRange.
func (m *InfoRsp) ChunkBufs(queueDepth int, chunkSize uint32, dst []RemoteChunk) ([]RemoteChunk, error) {
	n := len(m.Desc)
	if n == 0 {
		return dst[:0], wireErr(ErrOutOfRange, "info_rsp", "sg_cnt is 0")
	}
	if err := CheckImmFit(queueDepth, int(chunkSize)); err != nil {
		return dst[:0], err
	}
	if queueDepth%n != 0 {
		return dst[:0], wireErr(ErrOutOfRange, "info_rsp", "queue depth %d is not a multiple of sg_cnt %d", queueDepth, n)
	}
	var total uint64
	for i, d := range m.Desc {
		if d.Len == 0 || d.Len%chunkSize != 0 {
			return dst[:0], wireErr(ErrOutOfRange, "info_rsp", "desc[%d].len %d is not a non-zero multiple of chunk size %d", i, d.Len, chunkSize)
		}
		total += uint64(d.Len)
	}
	if want := uint64(queueDepth) * uint64(chunkSize); total != want {
		return dst[:0], wireErr(ErrOutOfRange, "info_rsp", "descriptors cover %d bytes, want %d (%d chunks of %d)", total, want, queueDepth, chunkSize)
	}
	if cap(dst) < queueDepth {
		dst = make([]RemoteChunk, 0, queueDepth)
	}
	dst = dst[:0]
	for _, d := range m.Desc {
		for k := uint32(0); k < d.Len/chunkSize; k++ {
			dst = append(dst, RemoteChunk{Addr: d.Addr + uint64(k)*uint64(chunkSize), RKey: d.Key})
		}
	}
	return dst, nil
}
