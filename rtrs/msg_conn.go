package rtrs

import "encoding/binary"

// UUID is a 16-byte UUID as carried on the wire: raw bytes, no byte swapping.
type UUID [16]byte

// ConnReq is rtrs_msg_conn_req (56 bytes), the RDMA CM private data of
// rdma_connect, one per connection of a path:
//
//	off 0  u8    cma_version  0 (the CMA owns these bytes for AF_IB)
//	off 1  u8    ip_version   0
//	off 2  le16  magic        Magic (0x1BBD)
//	off 4  le16  version      ProtoVersion (0x0200); only the major is checked
//	off 6  le16  cid          index of this connection in the path
//	off 8  le16  cid_num      number of connections of the path
//	off 10 le16  recon_cnt    client reconnect counter (informational)
//	off 12 16    sess_uuid    UUID of the path
//	off 28 16    paths_uuid   UUID of the session (group of paths)
//	off 44 u8    bit 0: first_conn, bit 1: fence (urnbd), bit 2: auth
//	             (urnbd), bits 3..7 reserved
//	off 45 11    reserved; with auth: on cid 0 the key id (8 bytes) and 3
//	             zeros, on other cids the connection's proof (see auth.go)
//
// Encoding writes zeros to cma_version, ip_version and the reserved bits;
// decoding ignores them, as the kernel server does.
type ConnReq struct {
	// CID is the index of this connection within the path, 0..CIDNum-1;
	// cid 0 is the service (admin) connection.
	CID uint16
	// CIDNum is the number of connections of the path (nr_cpu_ids +
	// nr_poll_queues + 1), 1..MaxConnsPerPath.
	CIDNum uint16
	// ReconCnt is the client's reconnect counter; the server only stores it.
	ReconCnt uint16
	// SessUUID identifies the path (random, kept across reconnects).
	SessUUID UUID
	// PathsUUID identifies the session, the group of paths.
	PathsUUID UUID
	// FirstConn allows the server to create a new session for PathsUUID; a
	// server rejects an unknown session without it (-ENXIO).
	FirstConn bool
	// Fence says the client fences the paths it gives up (FenceReq) before
	// it resends their requests: a urnbd extension in a bit the kernel
	// leaves reserved and ignores. A urnbd server answers FlagFence.
	Fence bool
	// Auth offers authentication (a urnbd extension in a reserved bit,
	// like Fence); AuthData then holds the key id (cid 0, SetKeyID) or
	// the connection's proof (ConnProof).
	Auth     bool
	AuthData [connReqAuthLen]byte
}

// connReqAuthLen is the size of ConnReq's reserved tail that carries
// AuthData.
const connReqAuthLen = ConnReqSize - 45

// SetKeyID stores id in AuthData, for the cid 0 request.
func (m *ConnReq) SetKeyID(id KeyID) {
	m.AuthData = [connReqAuthLen]byte{}
	copy(m.AuthData[:], id[:])
}

// KeyID returns the key id of a cid 0 request with Auth.
func (m *ConnReq) KeyID() KeyID {
	var id KeyID
	copy(id[:], m.AuthData[:])
	return id
}

// Size returns ConnReqSize.
func (m *ConnReq) Size() int { return ConnReqSize }

func (m *ConnReq) check() error {
	if m.CIDNum == 0 || m.CIDNum > MaxConnsPerPath {
		return wireErr(ErrOutOfRange, "conn_req", "cid_num %d not in 1..%d", m.CIDNum, MaxConnsPerPath)
	}
	if m.CID >= m.CIDNum {
		return wireErr(ErrOutOfRange, "conn_req", "cid %d >= cid_num %d", m.CID, m.CIDNum)
	}
	return nil
}

// MarshalTo writes the 56-byte request to b and returns 56. It fails if
// CIDNum is not in 1..MaxConnsPerPath or CID >= CIDNum.
func (m *ConnReq) MarshalTo(b []byte) (int, error) {
	if len(b) < ConnReqSize {
		return 0, errShortBuffer("conn_req", len(b), ConnReqSize)
	}
	if err := m.check(); err != nil {
		return 0, err
	}
	b = b[:ConnReqSize]
	clear(b)
	binary.LittleEndian.PutUint16(b[2:], Magic)
	binary.LittleEndian.PutUint16(b[4:], ProtoVersion)
	binary.LittleEndian.PutUint16(b[6:], m.CID)
	binary.LittleEndian.PutUint16(b[8:], m.CIDNum)
	binary.LittleEndian.PutUint16(b[10:], m.ReconCnt)
	copy(b[12:28], m.SessUUID[:])
	copy(b[28:44], m.PathsUUID[:])
	if m.FirstConn {
		b[44] |= 1
	}
	if m.Fence {
		b[44] |= 2
	}
	if m.Auth {
		b[44] |= 4
		copy(b[45:], m.AuthData[:])
	}
	return ConnReqSize, nil
}

// Unmarshal decodes a request from b, applying the kernel server's checks in
// its order: at least 56 bytes (ErrTruncated), magic (ErrBadMagic), major
// version (ErrBadVersion), cid_num <= MaxConnsPerPath and cid < cid_num
// (ErrOutOfRange). The kernel rejects all of these with -ECONNRESET. Bytes
// after the first 56 are ignored.
func (m *ConnReq) Unmarshal(b []byte) error {
	if len(b) < ConnReqSize {
		return errTruncated("conn_req", len(b), ConnReqSize)
	}
	if v := binary.LittleEndian.Uint16(b[2:]); v != Magic {
		return wireErr(ErrBadMagic, "conn_req", "magic %#04x, want %#04x", v, Magic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v>>8 != ProtoVerMajor {
		return wireErr(ErrBadVersion, "conn_req", "version %#04x, want major %d", v, ProtoVerMajor)
	}
	r := ConnReq{
		CID:       binary.LittleEndian.Uint16(b[6:]),
		CIDNum:    binary.LittleEndian.Uint16(b[8:]),
		ReconCnt:  binary.LittleEndian.Uint16(b[10:]),
		FirstConn: b[44]&1 != 0,
		Fence:     b[44]&2 != 0,
		Auth:      b[44]&4 != 0,
	}
	if r.Auth {
		copy(r.AuthData[:], b[45:ConnReqSize])
	}
	copy(r.SessUUID[:], b[12:28])
	copy(r.PathsUUID[:], b[28:44])
	if err := r.check(); err != nil {
		return err
	}
	*m = r
	return nil
}

// ConnRsp is rtrs_msg_conn_rsp (56 bytes), the RDMA CM private data of
// rdma_accept and rdma_reject:
//
//	off 0  le16  magic         Magic (0x1BBD)
//	off 2  le16  version       ProtoVersion (0x0200); only the major is checked
//	off 4  le16  errno         0 on accept; on reject a negative errno (s16)
//	off 6  le16  queue_depth   number of server chunks
//	off 8  le32  max_io_size   max data bytes of one request
//	off 12 le32  max_hdr_size  max user message + RTRS header bytes
//	off 16 le32  flags         FlagNewRkey; FlagFence, FlagAuth (urnbd)
//	off 20 16    reserved; with FlagAuth on cid 0 the server nonce
//	off 36 20    reserved
//
// A reject carries only magic, version and errno (other fields zero).
type ConnRsp struct {
	// Errno is 0 when the connection is accepted, else the negative errno
	// of the rejection (e.g. -104 = -ECONNRESET, sent as 0xFF98).
	Errno int16
	// QueueDepth is the number of chunks (buffers) of the server session;
	// at least 1 in an accepting response.
	QueueDepth uint16
	// MaxIOSize is the largest data length of one request
	// (max_chunk_size - max_hdr_size on a kernel server).
	MaxIOSize uint32
	// MaxHdrSize is the room for user message + RTRS header of one request
	// (4096 on a kernel server). Chunk size = MaxIOSize + MaxHdrSize.
	MaxHdrSize uint32
	// Flags holds FlagNewRkey when the server refreshes rkeys
	// (always_invalidate), and the urnbd flags.
	Flags uint32
	// Nonce is the server nonce of a cid 0 response with FlagAuth.
	Nonce [NonceSize]byte
}

// Size returns ConnRspSize.
func (m *ConnRsp) Size() int { return ConnRspSize }

// NewRkey reports whether FlagNewRkey is set.
func (m *ConnRsp) NewRkey() bool { return m.Flags&FlagNewRkey != 0 }

// ChunkSize returns MaxIOSize + MaxHdrSize, the size of one server chunk as
// the client computes it. It fails if the sum overflows 32 bits.
func (m *ConnRsp) ChunkSize() (uint32, error) {
	s := uint64(m.MaxIOSize) + uint64(m.MaxHdrSize)
	if s > 1<<32-1 {
		return 0, wireErr(ErrOutOfRange, "conn_rsp", "chunk size %d overflows 32 bits", s)
	}
	return uint32(s), nil
}

func (m *ConnRsp) check() error {
	if m.Errno == 0 && m.QueueDepth == 0 {
		return wireErr(ErrOutOfRange, "conn_rsp", "queue_depth 0 in an accepting response")
	}
	return nil
}

// MarshalTo writes the 56-byte response to b and returns 56. An accepting
// response (Errno 0) needs QueueDepth >= 1.
func (m *ConnRsp) MarshalTo(b []byte) (int, error) {
	if len(b) < ConnRspSize {
		return 0, errShortBuffer("conn_rsp", len(b), ConnRspSize)
	}
	if err := m.check(); err != nil {
		return 0, err
	}
	b = b[:ConnRspSize]
	clear(b)
	binary.LittleEndian.PutUint16(b[0:], Magic)
	binary.LittleEndian.PutUint16(b[2:], ProtoVersion)
	binary.LittleEndian.PutUint16(b[4:], uint16(m.Errno))
	binary.LittleEndian.PutUint16(b[6:], m.QueueDepth)
	binary.LittleEndian.PutUint32(b[8:], m.MaxIOSize)
	binary.LittleEndian.PutUint32(b[12:], m.MaxHdrSize)
	binary.LittleEndian.PutUint32(b[16:], m.Flags)
	if m.Flags&FlagAuth != 0 {
		copy(b[20:36], m.Nonce[:])
	}
	return ConnRspSize, nil
}

// Unmarshal decodes a response from b with the kernel client's checks: at
// least 56 bytes (ErrTruncated), magic (ErrBadMagic), major version
// (ErrBadVersion); in addition an accepting response (errno 0) must have a
// non-zero queue depth (ErrOutOfRange). A non-zero Errno is returned in m,
// not as an error. Reserved bytes and bytes after the first 56 are ignored.
func (m *ConnRsp) Unmarshal(b []byte) error {
	if len(b) < ConnRspSize {
		return errTruncated("conn_rsp", len(b), ConnRspSize)
	}
	if v := binary.LittleEndian.Uint16(b[0:]); v != Magic {
		return wireErr(ErrBadMagic, "conn_rsp", "magic %#04x, want %#04x", v, Magic)
	}
	if v := binary.LittleEndian.Uint16(b[2:]); v>>8 != ProtoVerMajor {
		return wireErr(ErrBadVersion, "conn_rsp", "version %#04x, want major %d", v, ProtoVerMajor)
	}
	r := ConnRsp{
		Errno:      int16(binary.LittleEndian.Uint16(b[4:])),
		QueueDepth: binary.LittleEndian.Uint16(b[6:]),
		MaxIOSize:  binary.LittleEndian.Uint32(b[8:]),
		MaxHdrSize: binary.LittleEndian.Uint32(b[12:]),
		Flags:      binary.LittleEndian.Uint32(b[16:]),
	}
	if r.Flags&FlagAuth != 0 {
		copy(r.Nonce[:], b[20:36])
	}
	if err := r.check(); err != nil {
		return err
	}
	*m = r
	return nil
}
