// Package frametest builds RTRS-over-TCP frames for the tests of
// rtrs/tcp and its frame codec: IO requests laid out as a client lays
// them out, for a small test session.
package frametest

import (
	"testing"

	"github.com/urnbd/urnbd/internal/wiretest"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// The test session's parameters.
const (
	QD    = 6 // not a power of two: buf ids 6 and 7 fit the imm but are out of range
	Chunk = 8192
	Hdr   = 1024
)

// Codec returns the immediate codec of the test session.
func Codec(t testing.TB) rtrs.ImmCodec {
	t.Helper()
	c, err := rtrs.NewImmCodec(QD, Chunk)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Frame is a test frame: header and payload.
type Frame struct {
	H frame.Header
	P []byte
}

// Bytes returns f as it goes on the wire.
func (f Frame) Bytes(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, frame.HeaderSize+len(f.P))
	_, err := frame.PutFrame(b, f.H, f.P)
	wiretest.NoErr(t, err)
	return b
}

// WriteReq builds a WRITE request frame for chunk bufID.
func WriteReq(t testing.TB, c rtrs.ImmCodec, bufID uint32, data, usr []byte) Frame {
	t.Helper()
	l, err := rtrs.WriteLayout(len(data), len(usr), Chunk, Hdr)
	wiretest.NoErr(t, err)
	chunk := make([]byte, Chunk)
	off, err := rtrs.PutWriteReq(chunk, data, usr)
	wiretest.NoErr(t, err)
	if off != l.HdrOff {
		t.Fatalf("PutWriteReq off %d, layout %d", off, l.HdrOff)
	}
	h, err := frame.IOReqHeader(c, bufID, l)
	wiretest.NoErr(t, err)
	return Frame{h, chunk[l.WriteOff : l.WriteOff+l.WriteLen]}
}

// ReadReq builds a READ request frame for chunk bufID.
func ReadReq(t testing.TB, c rtrs.ImmCodec, bufID uint32, dataLen int, usr []byte) Frame {
	t.Helper()
	descs := []rtrs.SGDesc{{Addr: 0x1000, Key: 7, Len: uint32(dataLen)}}
	l, err := rtrs.ReadLayout(dataLen, len(usr), 1, Chunk, Hdr)
	wiretest.NoErr(t, err)
	chunk := make([]byte, Chunk)
	off, err := rtrs.PutReadReq(chunk, dataLen, usr, rtrs.FlagNeedInval, descs)
	wiretest.NoErr(t, err)
	if off != l.HdrOff {
		t.Fatalf("PutReadReq off %d, layout %d", off, l.HdrOff)
	}
	h, err := frame.IOReqHeader(c, bufID, l)
	wiretest.NoErr(t, err)
	return Frame{h, chunk[l.WriteOff : l.WriteOff+l.WriteLen]}
}
