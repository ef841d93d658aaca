package rnbd

import "encoding/binary"

// IO is rnbd_msg_io, a block request. It has 26 bytes of fields and
// sizeof 32 (tail padding); the kernel client sends all 32:
//
//	off 0  4     hdr        type MsgIO (4)
//	off 4  le32  device_id  id from OpenRsp
//	off 8  le64  sector     start, in 512-byte sectors
//	off 16 le32  rw         op (bits 0..7) and flags (RW)
//	off 20 le32  bi_size    request length in bytes
//	off 24 le16  prio       block I/O priority (ioprio)
//	off 26 6     padding
//
// It travels as the user message of an RTRS READ (read, flush) or WRITE
// (write, discard, secure erase, write zeroes). For data requests the server
// requires BiSize to equal the RTRS data length (-EINVAL otherwise); for the
// others BiSize is the length to act on.
type IO struct {
	// DeviceID identifies the device in the session.
	DeviceID uint32
	// Sector is the start of the request in 512-byte sectors.
	Sector uint64
	// RW holds the op and the flags FlagSync, FlagFUA.
	RW RW
	// BiSize is the request length in bytes.
	BiSize uint32
	// Prio is the I/O priority; the kernel server applies it only for
	// sessions of version >= 2.
	Prio uint16
}

// Size returns IOSize.
func (m *IO) Size() int { return IOSize }

// setIODeviceID changes the device id of an IO message marshalled into b.
func setIODeviceID(b []byte, id uint32) { binary.LittleEndian.PutUint32(b[4:8], id) }

// MarshalTo writes the 32-byte message to b and returns 32. It fails if the
// op is not one of the six operations.
func (m *IO) MarshalTo(b []byte) (int, error) {
	if len(b) < IOSize {
		return 0, errShortBuffer("io", len(b), IOSize)
	}
	if op := m.RW.Op(); !op.Valid() {
		return 0, wireErr(ErrOutOfRange, "io", "unknown op %d", uint8(op))
	}
	_ = b[IOSize-1]
	le := binary.LittleEndian
	putHdr(b, MsgIO)
	le.PutUint32(b[4:], m.DeviceID)
	le.PutUint64(b[8:], m.Sector)
	le.PutUint32(b[16:], uint32(m.RW))
	le.PutUint32(b[20:], m.BiSize)
	le.PutUint16(b[24:], m.Prio)
	le.PutUint16(b[26:], 0)
	le.PutUint32(b[28:], 0)
	return IOSize, nil
}

// Unmarshal decodes the message from b, the user message of an IO request:
// at least IOMinSize (24) bytes (ErrTruncated), type MsgIO (ErrBadType) and
// a known op (ErrOutOfRange; the kernel server would warn and submit a
// read). Prio is read only when b holds at least IOSize (32) bytes, as the
// kernel server does; otherwise it is 0. Unknown flag bits are kept in RW.
func (m *IO) Unmarshal(b []byte) error {
	if err := checkHdr(b, MsgIO, IOMinSize, "io"); err != nil {
		return err
	}
	le := binary.LittleEndian
	rw := RW(le.Uint32(b[16:]))
	if op := rw.Op(); !op.Valid() {
		return wireErr(ErrOutOfRange, "io", "unknown op %d (rw %#x)", uint8(op), uint32(rw))
	}
	var prio uint16
	if len(b) >= IOSize {
		prio = le.Uint16(b[24:])
	}
	*m = IO{
		DeviceID: le.Uint32(b[4:]),
		Sector:   le.Uint64(b[8:]),
		RW:       rw,
		BiSize:   le.Uint32(b[20:]),
		Prio:     prio,
	}
	return nil
}
