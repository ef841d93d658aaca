package frame_test

import (
	"testing"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frametest"
)

// BenchmarkFrameEncodeDecode encodes a 4 KiB WRITE request frame (header
// and payload into a buffer, as a TCP sender would) and decodes it with
// Feed into a placed chunk, as a server would. 0 allocs/op.
func BenchmarkFrameEncodeDecode(b *testing.B) {
	c := frametest.Codec(b)
	usr := make([]byte, 32)
	data := make([]byte, 4096)
	l, err := rtrs.WriteLayout(len(data), len(usr), frametest.Chunk, frametest.Hdr)
	mustNoErr(b, err)
	src := make([]byte, frametest.Chunk)
	_, err = rtrs.PutWriteReq(src, data, usr)
	mustNoErr(b, err)
	payload := src[:l.WriteLen]
	wire := make([]byte, frame.HeaderSize+frametest.Chunk)
	var chunks [frametest.QD][frametest.Chunk]byte
	d := frame.NewDecoder(frame.ToServer)
	d.SetSession(c, placerFunc(func(f *frame.Frame) ([]byte, error) { return chunks[f.Imm.BufID][f.Off:], nil }))
	b.SetBytes(int64(frame.HeaderSize + len(payload)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h, err := frame.IOReqHeader(c, uint32(i%frametest.QD), l)
		if err != nil {
			b.Fatal(err)
		}
		n, err := frame.PutFrame(wire, h, payload)
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
	d := frame.NewDecoder(frame.ToClient)
	d.SetSession(frametest.Codec(b), nil)
	var wire [frame.HeaderSize]byte
	b.ReportAllocs()
	for b.Loop() {
		_, _ = frame.HeartbeatHeader(true).MarshalTo(wire[:])
		_, f, err := d.Feed(wire[:])
		if err != nil || f == nil {
			b.Fatal(err)
		}
	}
}
