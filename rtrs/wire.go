package rtrs

import (
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Protocol identity. Both peers check only the major version.
const (
	// Magic is the RTRS magic, le16 at the start of the connection request
	// (offset 2) and response (offset 0): 0x1BBD.
	Magic uint16 = 0x1BBD
	// ProtoVerMajor is the RTRS protocol major version (2). A peer whose
	// version>>8 differs is refused.
	ProtoVerMajor = 2
	// ProtoVerMinor is the RTRS protocol minor version (0); never checked.
	ProtoVerMinor = 0
	// ProtoVersion is the le16 version field sent on the wire: 0x0200.
	ProtoVersion uint16 = ProtoVerMajor<<8 | ProtoVerMinor
)

// Limits and defaults of the 6.12 implementation.
const (
	// DefaultPort is the TCP/IP port (RDMA CM port space TCP) the server
	// listens on by default: 1234 (RTRS_PORT in rnbd-proto.h).
	DefaultPort = 1234
	// ServiceConQueueDepth (512) sizes connection 0 of a path, the
	// service/admin connection; also caps the signal interval.
	ServiceConQueueDepth = 512
	// MaxPathsNum (128) is the maximum number of paths of one session, on
	// both sides.
	MaxPathsNum = 128
	// MaxConnsPerPath (4096) is the largest cid_num a server accepts in a
	// connection request.
	MaxConnsPerPath = 4096
	// MinChunkSize (8192) is the smallest server max_chunk_size.
	MinChunkSize = 8192
	// DefaultMaxChunkSize (131072, 128 KiB) is the server's default
	// max_chunk_size, the size of one chunk (receive buffer) in bytes.
	DefaultMaxChunkSize = 128 << 10
	// DefaultMaxHdrSize (4096, PAGE_SIZE on x86_64) is the max_hdr_size the
	// kernel server advertises: room for user message + RTRS header.
	DefaultMaxHdrSize = 4096
	// MaxSessQueueDepth (65535) bounds the server's queue depth, le16 on the
	// wire.
	MaxSessQueueDepth = 65535
	// DefaultSessQueueDepth (512) is the server's default number of chunks.
	DefaultSessQueueDepth = 512
	// ClientMaxSegments (128) is the 6.12 client's cap on data segments of
	// one request (4 KiB pages each).
	ClientMaxSegments = 128
	// ServerMaxReadSGCnt (1) is the largest sg_cnt of a READ request the
	// kernel server handles; it silently drops requests with more.
	ServerMaxReadSGCnt = 1
	// PathNameLen (255, NAME_MAX) is the size of the session name field of
	// INFO_REQ; the name itself is at most PathNameLen-1 bytes, NUL-terminated.
	PathNameLen = 255
)

// Timers.
const (
	// HBInterval is the heartbeat tick on connection 0: 5000 ms.
	HBInterval = 5000 * time.Millisecond
	// HBMissedMax (5): a path is declared dead when the miss counter
	// exceeds this value at a tick.
	HBMissedMax = 5
	// ConnectTimeout (30 s) bounds address/route resolution, each
	// connection, the INFO_RSP wait and the disconnect wait.
	ConnectTimeout = 30 * time.Second
	// ReconnectBackoff (1 s) is slept at the start of every reconnect attempt.
	ReconnectBackoff = 1 * time.Second
	// ReconnectSeed (8 ms): a random 0..ReconnectSeed-1 milliseconds is added
	// to the reconnect delay.
	ReconnectSeed = 8 * time.Millisecond
)

// MsgType is the le16 type field at offset 0 of the RTRS messages that carry
// one (all except the connection request and response).
type MsgType uint16

// RTRS message types.
const (
	// MsgInfoReq (0): client→server SEND on connection 0, the session name.
	MsgInfoReq MsgType = 0
	// MsgInfoRsp (1): server→client SEND on connection 0, the chunk MRs.
	MsgInfoRsp MsgType = 1
	// MsgWrite (2): header of a write request placed in a chunk by an
	// RDMA-WRITE-with-IMM (data travels client→server).
	MsgWrite MsgType = 2
	// MsgRead (3): header of a read request placed in a chunk by an
	// RDMA-WRITE-with-IMM (data travels server→client).
	MsgRead MsgType = 3
	// MsgRkeyRsp (4): server→client SEND-with-IMM carrying a chunk's new
	// rkey (only when FlagNewRkey was advertised).
	MsgRkeyRsp MsgType = 4
)

// String returns the kernel-style name of t.
func (t MsgType) String() string {
	switch t {
	case MsgInfoReq:
		return "INFO_REQ"
	case MsgInfoRsp:
		return "INFO_RSP"
	case MsgWrite:
		return "WRITE"
	case MsgRead:
		return "READ"
	case MsgRkeyRsp:
		return "RKEY_RSP"
	case MsgFenceReq:
		return "FENCE_REQ"
	case MsgFenceRsp:
		return "FENCE_RSP"
	}
	return "MsgType(" + strconv.Itoa(int(t)) + ")"
}

// Message flags.
const (
	// FlagNeedInval (0x1), in the le16 flags of a READ request: the client
	// registered its buffer for this request and asks the server to
	// invalidate the rkey (SEND_WITH_INV) before the response.
	FlagNeedInval uint16 = 1 << 0
	// FlagNewRkey (0x2), in the le32 flags of the connection response: the
	// server re-registers a chunk after every request (always_invalidate)
	// and returns the new rkey in an RKEY_RSP with the response; the client
	// must post 8-byte receive buffers.
	FlagNewRkey uint32 = 1 << 1
	// FlagFence (0x10000), in the flags of the connection response: a urnbd
	// server that takes FenceReq, sent only to a client whose ConnReq said
	// Fence (a kernel client never sees it).
	FlagFence uint32 = 1 << 16
)

// Wire sizes in bytes.
const (
	SGDescSize       = 16  // rtrs_sg_desc
	ConnReqSize      = 56  // rtrs_msg_conn_req (RDMA CM private data)
	ConnRspSize      = 56  // rtrs_msg_conn_rsp (RDMA CM private data)
	InfoReqSize      = 272 // rtrs_msg_info_req
	InfoRspHdrSize   = 8   // rtrs_msg_info_rsp without descriptors
	RkeyRspSize      = 8   // rtrs_msg_rkey_rsp
	RdmaReadHdrSize  = 8   // rtrs_msg_rdma_read without descriptors
	RdmaWriteMsgSize = 4   // rtrs_msg_rdma_write
	FenceReqSize     = 20  // FenceReq (urnbd)
	FenceRspSize     = 20  // FenceRsp (urnbd)
)

// BitsFor returns the kernel's ilog2(x)+1 for x>0 and 0 for x==0: the number
// of bits needed to hold any value in 0..x.
func BitsFor(x uint32) int { return bits.Len32(x) }

// CheckImmFit reports whether queueDepth buffer ids and offsets below
// chunkSize fit together into the 28-bit IO_REQ immediate payload:
// BitsFor(queueDepth-1) + BitsFor(chunkSize-1) <= 28.
func CheckImmFit(queueDepth, chunkSize int) error {
	if queueDepth < 1 || queueDepth > MaxSessQueueDepth {
		return wireErr(ErrOutOfRange, "imm", "queue depth %d not in 1..%d", queueDepth, MaxSessQueueDepth)
	}
	if chunkSize < 1 || chunkSize > ImmPayloadMask+1 {
		return wireErr(ErrOutOfRange, "imm", "chunk size %d not in 1..%d", chunkSize, ImmPayloadMask+1)
	}
	if BitsFor(uint32(queueDepth-1))+BitsFor(uint32(chunkSize-1)) > ImmPayloadBits {
		return wireErr(ErrOutOfRange, "imm", "%d buffers of %d bytes do not fit %d immediate bits",
			queueDepth, chunkSize, ImmPayloadBits)
	}
	return nil
}

// CheckServerParams applies the kernel server's module-parameter rules:
// chunkSize (max_chunk_size) a power of two >= MinChunkSize, queueDepth
// (sess_queue_depth) in 1..MaxSessQueueDepth, and both fitting CheckImmFit.
func CheckServerParams(queueDepth, chunkSize int) error {
	if chunkSize < MinChunkSize || chunkSize&(chunkSize-1) != 0 {
		return wireErr(ErrOutOfRange, "server params", "max_chunk_size %d must be a power of two >= %d", chunkSize, MinChunkSize)
	}
	return CheckImmFit(queueDepth, chunkSize)
}

// CheckSessName applies the rules both kernel sides use for a session name
// (INFO_REQ pathname): 1..PathNameLen-1 bytes, no NUL, no '/' and no '.'.
func CheckSessName(name string) error {
	if len(name) == 0 || len(name) > PathNameLen-1 {
		return wireErr(ErrOutOfRange, "session name", "length %d not in 1..%d", len(name), PathNameLen-1)
	}
	if i := strings.IndexAny(name, "/.\x00"); i >= 0 {
		return wireErr(ErrOutOfRange, "session name", "%q contains %q", name, name[i])
	}
	return nil
}

// IncRkey returns the rkey with its low (key) byte incremented, as the
// kernel's ib_inc_rkey does before every re-registration of an MR.
func IncRkey(rkey uint32) uint32 {
	return rkey&^0xFF | (rkey+1)&0xFF
}
