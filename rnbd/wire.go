package rnbd

import (
	"encoding/binary"
	"strconv"
	"strings"

	"github.com/urnbd/urnbd/rtrs"
)

// Protocol identity. Only the major version (a u8 in SessInfo) is exchanged.
const (
	// ProtoVerMajor is the RNBD protocol major version (2), sent in
	// SessInfo.Ver; a session runs at min(client, server) version.
	ProtoVerMajor = 2
	// ProtoVerMinor is the RNBD protocol minor version (2: FlagPreflush
	// of 2.1 and FlagNoUnmap of 2.2); never sent. Peers of any minor
	// interoperate: a 2.0 peer ignores the flags, which come with the
	// 2.0 behaviour (FUA beside PREFLUSH).
	ProtoVerMinor = 2
	// DefaultPort is the port the server listens on by default (1234).
	DefaultPort = rtrs.DefaultPort
)

// Limits and units.
const (
	// DevNameLen (255, NAME_MAX) is the size of Open's dev_name field; the
	// name itself is at most DevNameLen-1 bytes, NUL-terminated.
	DevNameLen = 255
	// PathMax (4096, PATH_MAX) bounds the server's full device path.
	PathMax = 4096
	// SectorSize (512) is the unit of sectors on the wire.
	SectorSize = 512
	// DefaultDevSearchPath ("/") is the kernel server's default
	// dev_search_path.
	DefaultDevSearchPath = "/"
	// SessNameToken ("%SESSNAME%") in dev_search_path is replaced by the
	// session name.
	SessNameToken = "%SESSNAME%"
)

// Wire sizes in bytes.
const (
	MsgHdrSize      = 4   // rnbd_msg_hdr
	SessInfoSize    = 36  // rnbd_msg_sess_info
	SessInfoRspSize = 36  // rnbd_msg_sess_info_rsp
	OpenSize        = 264 // rnbd_msg_open
	OpenRspSize     = 56  // rnbd_msg_open_rsp
	CloseSize       = 8   // rnbd_msg_close
	IOSize          = 32  // rnbd_msg_io, sizeof including 6 bytes of tail padding
	// IOMinSize (24) is the shortest IO message accepted: everything up to
	// and including bi_size. The kernel server reads prio only from user
	// messages of at least IOSize bytes.
	IOMinSize = 24
)

// MsgType is the le16 type at offset 0 of every RNBD message (rnbd_msg_hdr).
type MsgType uint16

// RNBD message types.
const (
	// MsgSessInfo (0): client→server as an RTRS READ on the admin
	// connection; the 36-byte reply buffer receives a SessInfoRsp.
	MsgSessInfo MsgType = 0
	// MsgSessInfoRsp (1): server→client, written into the READ buffer.
	MsgSessInfoRsp MsgType = 1
	// MsgOpen (2): client→server as an RTRS READ on the admin connection;
	// the 56-byte reply buffer receives an OpenRsp.
	MsgOpen MsgType = 2
	// MsgOpenRsp (3): server→client, written into the READ buffer.
	MsgOpenRsp MsgType = 3
	// MsgIO (4): block IO, an RTRS READ for reads and flushes, an RTRS WRITE
	// for writes, discards, secure erases and write-zeroes.
	MsgIO MsgType = 4
	// MsgClose (5): client→server as an RTRS WRITE without data.
	MsgClose MsgType = 5
)

// Known reports whether t is one of the RNBD message types.
func (t MsgType) Known() bool { return t <= MsgClose }

// String returns the kernel-style name of t.
func (t MsgType) String() string {
	switch t {
	case MsgSessInfo:
		return "SESS_INFO"
	case MsgSessInfoRsp:
		return "SESS_INFO_RSP"
	case MsgOpen:
		return "OPEN"
	case MsgOpenRsp:
		return "OPEN_RSP"
	case MsgIO:
		return "IO"
	case MsgClose:
		return "CLOSE"
	}
	return "MsgType(" + strconv.Itoa(int(t)) + ")"
}

// MsgHdr is rnbd_msg_hdr (4 bytes), the start of every RNBD message:
//
//	off 0  le16  type     MsgType
//	off 2  le16  padding  0
type MsgHdr struct {
	// Type is the message type.
	Type MsgType
}

// Size returns MsgHdrSize.
func (m *MsgHdr) Size() int { return MsgHdrSize }

// MarshalTo writes the 4-byte header to b and returns 4. It fails for an
// unknown type.
func (m *MsgHdr) MarshalTo(b []byte) (int, error) {
	if len(b) < MsgHdrSize {
		return 0, errShortBuffer("msg_hdr", len(b), MsgHdrSize)
	}
	if !m.Type.Known() {
		return 0, wireErr(ErrBadType, "msg_hdr", "unknown type %v", m.Type)
	}
	putHdr(b, m.Type)
	return MsgHdrSize, nil
}

// Unmarshal reads the header from b: at least 4 bytes (ErrTruncated) and a
// known type (ErrBadType; the kernel server answers -EINVAL). The padding is
// ignored.
func (m *MsgHdr) Unmarshal(b []byte) error {
	t, err := PeekType(b)
	if err != nil {
		return err
	}
	m.Type = t
	return nil
}

// PeekType returns the type of the RNBD message in b (the user message of an
// RTRS request) for dispatching. It needs the 4-byte header (ErrTruncated)
// and a known type (ErrBadType).
func PeekType(b []byte) (MsgType, error) {
	if len(b) < MsgHdrSize {
		return 0, errTruncated("msg_hdr", len(b), MsgHdrSize)
	}
	t := MsgType(binary.LittleEndian.Uint16(b))
	if !t.Known() {
		return 0, wireErr(ErrBadType, "msg_hdr", "unknown type %v", t)
	}
	return t, nil
}

func putHdr(b []byte, t MsgType) {
	binary.LittleEndian.PutUint16(b[0:], uint16(t))
	binary.LittleEndian.PutUint16(b[2:], 0)
}

// checkHdr checks that b holds at least size bytes and starts with type want.
func checkHdr(b []byte, want MsgType, size int, name string) error {
	if len(b) < size {
		return errTruncated(name, len(b), size)
	}
	if t := MsgType(binary.LittleEndian.Uint16(b)); t != want {
		return wireErr(ErrBadType, name, "type %v, want %v", t, want)
	}
	return nil
}

// AccessMode is the u8 access_mode of Open: how a client maps a device.
type AccessMode uint8

// Access modes. An exported device may be opened read-only any number of
// times, read-write once, and a second time read-write with AccessMigration.
const (
	// AccessRO (0): read-only, "ro".
	AccessRO AccessMode = 0
	// AccessRW (1): read-write, "rw" (the map default); only if the device
	// has no writer yet.
	AccessRW AccessMode = 1
	// AccessMigration (2): read-write, "migration"; allowed while the
	// device has fewer than two writers.
	AccessMigration AccessMode = 2
)

// Valid reports whether m is ro, rw or migration.
func (m AccessMode) Valid() bool { return m <= AccessMigration }

// Writable reports whether the device is opened for writing (rw or
// migration).
func (m AccessMode) Writable() bool { return m != AccessRO }

// String returns "ro", "rw" or "migration" (the sysfs spelling).
func (m AccessMode) String() string {
	switch m {
	case AccessRO:
		return "ro"
	case AccessRW:
		return "rw"
	case AccessMigration:
		return "migration"
	}
	return "AccessMode(" + strconv.Itoa(int(m)) + ")"
}

// ParseAccessMode parses "ro", "rw" or "migration" (exact, as the kernel's
// map_device does); anything else wraps ErrOutOfRange.
func ParseAccessMode(s string) (AccessMode, error) {
	switch s {
	case "ro":
		return AccessRO, nil
	case "rw":
		return AccessRW, nil
	case "migration":
		return AccessMigration, nil
	}
	return 0, wireErr(ErrOutOfRange, "access_mode", "%q is not ro, rw or migration", s)
}

// IOOp is the operation in the low 8 bits of IO.RW.
type IOOp uint8

// IO operations.
const (
	// OpRead (0): read; an RTRS READ.
	OpRead IOOp = 0
	// OpWrite (1): write; an RTRS WRITE with data.
	OpWrite IOOp = 1
	// OpFlush (2): flush the volatile cache (the server submits an empty
	// write with PREFLUSH); an RTRS READ without data.
	OpFlush IOOp = 2
	// OpDiscard (3): discard BiSize bytes; an RTRS WRITE without data.
	OpDiscard IOOp = 3
	// OpSecureErase (4): securely erase BiSize bytes; RTRS WRITE, no data.
	OpSecureErase IOOp = 4
	// OpWriteZeroes (5): write zeroes to BiSize bytes; RTRS WRITE, no data.
	// (Value 5 was WRITE_SAME in older kernels.)
	OpWriteZeroes IOOp = 5
)

// Valid reports whether op is one of the six operations.
func (op IOOp) Valid() bool { return op <= OpWriteZeroes }

// String returns the kernel-style name of op.
func (op IOOp) String() string {
	switch op {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	case OpFlush:
		return "FLUSH"
	case OpDiscard:
		return "DISCARD"
	case OpSecureErase:
		return "SECURE_ERASE"
	case OpWriteZeroes:
		return "WRITE_ZEROES"
	}
	return "IOOp(" + strconv.Itoa(int(op)) + ")"
}

// RTRSRead reports whether a request with this op travels as an RTRS READ
// (read and flush) rather than an RTRS WRITE.
func (op IOOp) RTRSRead() bool { return op == OpRead || op == OpFlush }

// HasData reports whether a request with this op carries data (read and
// write); the others send only BiSize.
func (op IOOp) HasData() bool { return op == OpRead || op == OpWrite }

// IO request flags, in IO.RW above the op byte.
const (
	// OpMask (0xFF) selects the operation in RW.
	OpMask = 0xFF
	// FlagSync (0x100, bit 8): the request is synchronous (reads, and
	// writes with SYNC, FUA or PREFLUSH); the server sets REQ_SYNC.
	FlagSync uint32 = 1 << 8
	// FlagFUA (0x200, bit 9): forced unit access; set by the client for FUA
	// or PREFLUSH requests; the server sets REQ_FUA.
	FlagFUA uint32 = 1 << 9
	// FlagPreflush (0x400, bit 10; protocol 2.1): flush the volatile
	// cache before the request (REQ_PREFLUSH). A 2.1 client sends it with
	// FlagFUA, so that a 2.0 server at least writes through.
	FlagPreflush uint32 = 1 << 10
	// FlagNoUnmap (0x800, bit 11; protocol 2.2): an OpWriteZeroes must
	// not deallocate the range (REQ_NOUNMAP).
	FlagNoUnmap uint32 = 1 << 11
)

// RW is the le32 rw field of IO: op in bits 0..7, flags above.
type RW uint32

// MakeRW combines an op and flags (FlagSync, FlagFUA).
func MakeRW(op IOOp, flags uint32) RW { return RW(uint32(op) | flags&^OpMask) }

// Op returns the operation.
func (rw RW) Op() IOOp { return IOOp(rw & OpMask) }

// Flags returns the flag bits (rw without the op byte).
func (rw RW) Flags() uint32 { return uint32(rw) &^ OpMask }

// Sync reports FlagSync.
func (rw RW) Sync() bool { return uint32(rw)&FlagSync != 0 }

// FUA reports FlagFUA.
func (rw RW) FUA() bool { return uint32(rw)&FlagFUA != 0 }

// Preflush reports FlagPreflush.
func (rw RW) Preflush() bool { return uint32(rw)&FlagPreflush != 0 }

// NoUnmap reports FlagNoUnmap.
func (rw RW) NoUnmap() bool { return uint32(rw)&FlagNoUnmap != 0 }

// String returns e.g. "WRITE|SYNC|FUA"; unknown flag bits are shown in hex.
func (rw RW) String() string {
	var sb strings.Builder
	sb.WriteString(rw.Op().String())
	f := rw.Flags()
	if f&FlagSync != 0 {
		sb.WriteString("|SYNC")
	}
	if f&FlagFUA != 0 {
		sb.WriteString("|FUA")
	}
	if f&FlagPreflush != 0 {
		sb.WriteString("|PREFLUSH")
	}
	if f&FlagNoUnmap != 0 {
		sb.WriteString("|NOUNMAP")
	}
	if rest := f &^ (FlagSync | FlagFUA | FlagPreflush | FlagNoUnmap); rest != 0 {
		sb.WriteString("|0x")
		sb.WriteString(strconv.FormatUint(uint64(rest), 16))
	}
	return sb.String()
}

// Cache policy bits of OpenRsp.CachePolicy.
const (
	// CacheFUA (0x1): the device supports FUA.
	CacheFUA uint8 = 1 << 0
	// CacheWriteback (0x2): the device has a volatile write cache; the
	// kernel client enables FUA only together with it.
	CacheWriteback uint8 = 1 << 1
)
