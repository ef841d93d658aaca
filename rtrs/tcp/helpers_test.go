package tcp

import (
	"testing"

	"github.com/urnbd/urnbd/internal/wiretest"
	"github.com/urnbd/urnbd/rtrs"
)

const (
	testQD    = 6 // not a power of two: buf ids 6 and 7 fit the imm but are out of range
	testChunk = 8192
	testHdr   = 1024
)

func testCodec(t testing.TB) rtrs.ImmCodec {
	t.Helper()
	c, err := rtrs.NewImmCodec(testQD, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// frame is a test frame: header and payload.
type frame struct {
	h Header
	p []byte
}

func (f frame) bytes(t testing.TB) []byte {
	t.Helper()
	b := make([]byte, HeaderSize+len(f.p))
	_, err := PutFrame(b, f.h, f.p)
	mustNoErr(t, err)
	return b
}

// writeFrame builds a WRITE request frame for chunk bufID.
func writeFrame(t testing.TB, c rtrs.ImmCodec, bufID uint32, data, usr []byte) frame {
	t.Helper()
	l, err := rtrs.WriteLayout(len(data), len(usr), testChunk, testHdr)
	mustNoErr(t, err)
	chunk := make([]byte, testChunk)
	off, err := rtrs.PutWriteReq(chunk, data, usr)
	mustNoErr(t, err)
	if off != l.HdrOff {
		t.Fatalf("PutWriteReq off %d, layout %d", off, l.HdrOff)
	}
	h, err := IOReqHeader(c, bufID, l)
	mustNoErr(t, err)
	return frame{h, chunk[l.WriteOff : l.WriteOff+l.WriteLen]}
}

// readFrame builds a READ request frame for chunk bufID.
func readFrame(t testing.TB, c rtrs.ImmCodec, bufID uint32, dataLen int, usr []byte) frame {
	t.Helper()
	descs := []rtrs.SGDesc{{Addr: 0x1000, Key: 7, Len: uint32(dataLen)}}
	l, err := rtrs.ReadLayout(dataLen, len(usr), 1, testChunk, testHdr)
	mustNoErr(t, err)
	chunk := make([]byte, testChunk)
	off, err := rtrs.PutReadReq(chunk, dataLen, usr, rtrs.FlagNeedInval, descs)
	mustNoErr(t, err)
	if off != l.HdrOff {
		t.Fatalf("PutReadReq off %d, layout %d", off, l.HdrOff)
	}
	h, err := IOReqHeader(c, bufID, l)
	mustNoErr(t, err)
	return frame{h, chunk[l.WriteOff : l.WriteOff+l.WriteLen]}
}

var (
	wantErr   = wiretest.WantErr
	mustNoErr = wiretest.NoErr
)

// onQueue runs fn on q's thread, soon (ClientQueue.Do).
func onQueue(q *ClientQueue, fn func(q *ClientQueue)) { q.Do(func() { fn(q) }) }
