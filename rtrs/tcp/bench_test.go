package tcp

import (
	"testing"

	"github.com/urnbd/urnbd/rtrs"
)

// BenchmarkFrameEncodeDecode encodes a 4 KiB WRITE request frame (header
// and payload into a buffer, as a TCP sender would) and decodes it with
// Feed into a placed chunk, as a server would. 0 allocs/op.
func BenchmarkFrameEncodeDecode(b *testing.B) {
	c := testCodec(b)
	usr := make([]byte, 32)
	data := make([]byte, 4096)
	l, err := rtrs.WriteLayout(len(data), len(usr), testChunk, testHdr)
	mustNoErr(b, err)
	src := make([]byte, testChunk)
	_, err = rtrs.PutWriteReq(src, data, usr)
	mustNoErr(b, err)
	payload := src[:l.WriteLen]
	wire := make([]byte, HeaderSize+testChunk)
	var chunks [testQD][testChunk]byte
	d := NewDecoder(ToServer)
	d.SetSession(c, placerFunc(func(f *Frame) ([]byte, error) { return chunks[f.Imm.BufID][f.Off:], nil }))
	b.SetBytes(int64(HeaderSize + len(payload)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h, err := IOReqHeader(c, uint32(i%testQD), l)
		if err != nil {
			b.Fatal(err)
		}
		n, err := PutFrame(wire, h, payload)
		if err != nil {
			b.Fatal(err)
		}
		p := wire[:n]
		for len(p) > 0 {
			m, f, err := d.Feed(p)
			if err != nil {
				b.Fatal(err)
			}
			p = p[m:]
			if f != nil && f.Imm.Off != l.HdrOff {
				b.Fatal("bad frame")
			}
		}
	}
}

// BenchmarkHeaderEncodeDecode is the per-frame overhead alone: a heartbeat
// header encoded and decoded. 0 allocs/op.
func BenchmarkHeaderEncodeDecode(b *testing.B) {
	d := NewDecoder(ToClient)
	d.SetSession(testCodec(b), nil)
	var wire [HeaderSize]byte
	b.ReportAllocs()
	for b.Loop() {
		_, _ = HeartbeatHeader(true).MarshalTo(wire[:])
		_, f, err := d.Feed(wire[:])
		if err != nil || f == nil {
			b.Fatal(err)
		}
	}
}
