package rnbd

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// Open is rnbd_msg_open (264 bytes), the request to map a device, sent by
// the client as an RTRS READ on the admin connection with a 56-byte reply
// buffer for the OpenRsp:
//
//	off 0   4    hdr          type MsgOpen (2)
//	off 4   u8   access_mode  AccessMode
//	off 5   u8   resv1
//	off 6   255  dev_name     device path, NUL-terminated
//	off 261 3    reserved
type Open struct {
	// AccessMode is ro, rw or migration.
	AccessMode AccessMode
	// DevName holds the device path (relative to the server's
	// dev_search_path), NUL-terminated: at most DevNameLen-1 bytes, then
	// zeros. Use SetDevName and DevNameBytes.
	DevName [DevNameLen]byte
}

// Size returns OpenSize.
func (m *Open) Size() int { return OpenSize }

// SetDevName stores name in m.DevName. It fails if name is longer than
// DevNameLen-1 bytes or contains a NUL.
func (m *Open) SetDevName(name string) error {
	if len(name) > DevNameLen-1 {
		return wireErr(ErrOutOfRange, "open", "dev_name length %d exceeds %d", len(name), DevNameLen-1)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return wireErr(ErrOutOfRange, "open", "dev_name %q contains NUL", name)
	}
	m.DevName = [DevNameLen]byte{}
	copy(m.DevName[:], name)
	return nil
}

// DevNameBytes returns the device path (the bytes before the first NUL), a
// slice of m.DevName.
func (m *Open) DevNameBytes() []byte {
	if i := bytes.IndexByte(m.DevName[:], 0); i >= 0 {
		return m.DevName[:i]
	}
	return m.DevName[:]
}

// DevNameString returns the device path as a string.
func (m *Open) DevNameString() string { return string(m.DevNameBytes()) }

// MarshalTo writes the 264-byte message to b and returns 264. It fails if
// AccessMode is not valid or DevName is not NUL-terminated; bytes of DevName
// after the NUL are written as zeros.
func (m *Open) MarshalTo(b []byte) (int, error) {
	if len(b) < OpenSize {
		return 0, errShortBuffer("open", len(b), OpenSize)
	}
	if !m.AccessMode.Valid() {
		return 0, wireErr(ErrOutOfRange, "open", "access_mode %d is not ro, rw or migration", uint8(m.AccessMode))
	}
	n := bytes.IndexByte(m.DevName[:], 0)
	if n < 0 {
		return 0, wireErr(ErrOutOfRange, "open", "dev_name not NUL-terminated within %d bytes", DevNameLen)
	}
	b = b[:OpenSize]
	clear(b)
	putHdr(b, MsgOpen)
	b[4] = uint8(m.AccessMode)
	copy(b[6:], m.DevName[:n])
	return OpenSize, nil
}

// Unmarshal decodes the message from b: at least 264 bytes (ErrTruncated),
// type MsgOpen (ErrBadType), access mode ro/rw/migration (ErrOutOfRange; the
// kernel server answers -EINVAL) and dev_name NUL-terminated within its 255
// bytes (ErrOutOfRange; the kernel client always terminates it). Bytes after
// the NUL, resv1 and reserved are ignored. The path rules of the server are
// in ResolveDevPath.
func (m *Open) Unmarshal(b []byte) error {
	if err := checkHdr(b, MsgOpen, OpenSize, "open"); err != nil {
		return err
	}
	mode := AccessMode(b[4])
	if !mode.Valid() {
		return wireErr(ErrOutOfRange, "open", "access_mode %d is not ro, rw or migration", b[4])
	}
	f := b[6 : 6+DevNameLen]
	n := bytes.IndexByte(f, 0)
	if n < 0 {
		return wireErr(ErrOutOfRange, "open", "dev_name not NUL-terminated within %d bytes", DevNameLen)
	}
	m.AccessMode = mode
	m.DevName = [DevNameLen]byte{}
	copy(m.DevName[:], f[:n])
	return nil
}

// OpenRsp is rnbd_msg_open_rsp (56 bytes), the server's reply to Open,
// written into the client's READ buffer (the server zeroes it first):
//
//	off 0  4     hdr                       type MsgOpenRsp (3)
//	off 4  le32  device_id                 id of the device in the session
//	off 8  le64  nsectors                  size in 512-byte sectors
//	off 16 le32  max_hw_sectors            (the kernel client ignores it)
//	off 20 le32  max_write_zeroes_sectors
//	off 24 le32  max_discard_sectors
//	off 28 le32  discard_granularity       bytes
//	off 32 le32  discard_alignment         bytes
//	off 36 le16  physical_block_size       bytes
//	off 38 le16  logical_block_size        bytes, must be non-zero
//	off 40 le16  max_segments              (the kernel client ignores it)
//	off 42 le16  secure_discard            non-zero: secure erase supported
//	off 44 u8    obsolete_rotational       always 0
//	off 45 u8    cache_policy              CacheFUA | CacheWriteback
//	off 46 10    reserved
type OpenRsp struct {
	// DeviceID identifies the opened device in IO and Close messages.
	DeviceID uint32
	// NSectors is the device size in 512-byte sectors.
	NSectors uint64
	// MaxHWSectors is the device's max_hw_sectors (512-byte units).
	MaxHWSectors uint32
	// MaxWriteZeroesSectors limits OpWriteZeroes (512-byte units).
	MaxWriteZeroesSectors uint32
	// MaxDiscardSectors limits OpDiscard and, with SecureDiscard,
	// OpSecureErase (512-byte units).
	MaxDiscardSectors uint32
	// DiscardGranularity is the discard allocation unit in bytes.
	DiscardGranularity uint32
	// DiscardAlignment is the discard alignment offset in bytes.
	DiscardAlignment uint32
	// PhysicalBlockSize is the physical block size in bytes.
	PhysicalBlockSize uint16
	// LogicalBlockSize is the logical block size in bytes; 0 makes the
	// kernel client fail the open (see Check).
	LogicalBlockSize uint16
	// MaxSegments is the device's max segments per request.
	MaxSegments uint16
	// SecureDiscard is the device's max secure-erase sectors truncated to
	// 16 bits; non-zero means secure erase is supported.
	SecureDiscard uint16
	// CachePolicy holds CacheFUA and CacheWriteback.
	CachePolicy uint8
}

// Size returns OpenRspSize.
func (m *OpenRsp) Size() int { return OpenRspSize }

// MarshalTo writes the 56-byte message to b and returns 56.
func (m *OpenRsp) MarshalTo(b []byte) (int, error) {
	if len(b) < OpenRspSize {
		return 0, errShortBuffer("open_rsp", len(b), OpenRspSize)
	}
	b = b[:OpenRspSize]
	clear(b)
	putHdr(b, MsgOpenRsp)
	le := binary.LittleEndian
	le.PutUint32(b[4:], m.DeviceID)
	le.PutUint64(b[8:], m.NSectors)
	le.PutUint32(b[16:], m.MaxHWSectors)
	le.PutUint32(b[20:], m.MaxWriteZeroesSectors)
	le.PutUint32(b[24:], m.MaxDiscardSectors)
	le.PutUint32(b[28:], m.DiscardGranularity)
	le.PutUint32(b[32:], m.DiscardAlignment)
	le.PutUint16(b[36:], m.PhysicalBlockSize)
	le.PutUint16(b[38:], m.LogicalBlockSize)
	le.PutUint16(b[40:], m.MaxSegments)
	le.PutUint16(b[42:], m.SecureDiscard)
	b[45] = m.CachePolicy
	return OpenRspSize, nil
}

// Unmarshal decodes the message from b: at least 56 bytes (ErrTruncated),
// type MsgOpenRsp (ErrBadType). obsolete_rotational and reserved bytes are
// ignored. Unmarshal keeps responses the client must refuse (so that it
// still learns the device id it must close); Check applies those rules.
func (m *OpenRsp) Unmarshal(b []byte) error {
	if err := checkHdr(b, MsgOpenRsp, OpenRspSize, "open_rsp"); err != nil {
		return err
	}
	le := binary.LittleEndian
	*m = OpenRsp{
		DeviceID:              le.Uint32(b[4:]),
		NSectors:              le.Uint64(b[8:]),
		MaxHWSectors:          le.Uint32(b[16:]),
		MaxWriteZeroesSectors: le.Uint32(b[20:]),
		MaxDiscardSectors:     le.Uint32(b[24:]),
		DiscardGranularity:    le.Uint32(b[28:]),
		DiscardAlignment:      le.Uint32(b[32:]),
		PhysicalBlockSize:     le.Uint16(b[36:]),
		LogicalBlockSize:      le.Uint16(b[38:]),
		MaxSegments:           le.Uint16(b[40:]),
		SecureDiscard:         le.Uint16(b[42:]),
		CachePolicy:           b[45],
	}
	return nil
}

// Check applies the kernel client's rule to a received response: a zero
// LogicalBlockSize fails the open (-EINVAL, and the client sends Close for
// DeviceID). Failures wrap ErrOutOfRange.
func (m *OpenRsp) Check() error {
	if m.LogicalBlockSize == 0 {
		return wireErr(ErrOutOfRange, "open_rsp", "logical_block_size is 0 (device id %d)", m.DeviceID)
	}
	return nil
}

// Close is rnbd_msg_close (8 bytes), the request to unmap a device, sent as
// an RTRS WRITE without data; the server always answers 0:
//
//	off 0  4     hdr        type MsgClose (5)
//	off 4  le32  device_id
type Close struct {
	// DeviceID is the id from OpenRsp.
	DeviceID uint32
}

// Size returns CloseSize.
func (m *Close) Size() int { return CloseSize }

// MarshalTo writes the 8-byte message to b and returns 8.
func (m *Close) MarshalTo(b []byte) (int, error) {
	if len(b) < CloseSize {
		return 0, errShortBuffer("close", len(b), CloseSize)
	}
	putHdr(b, MsgClose)
	binary.LittleEndian.PutUint32(b[4:], m.DeviceID)
	return CloseSize, nil
}

// Unmarshal decodes the message from b: at least 8 bytes (ErrTruncated),
// type MsgClose (ErrBadType).
func (m *Close) Unmarshal(b []byte) error {
	if err := checkHdr(b, MsgClose, CloseSize, "close"); err != nil {
		return err
	}
	m.DeviceID = binary.LittleEndian.Uint32(b[4:])
	return nil
}
