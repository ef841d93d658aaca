package frame_test

import (
	"bytes"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frametest"
)

func TestHeaderWire(t *testing.T) {
	h := frame.Header{Imm: 0x00181020, Len: 0x1234, Off: 0x10}
	var b [frame.HeaderSize]byte
	n, err := h.MarshalTo(b[:])
	mustNoErr(t, err)
	want := []byte{0x20, 0x10, 0x18, 0x00, 0x34, 0x12, 0, 0, 0x10, 0, 0, 0}
	if n != frame.HeaderSize || !bytes.Equal(b[:], want) {
		t.Fatalf("got % x, want % x", b[:n], want)
	}
	var g frame.Header
	mustNoErr(t, g.Unmarshal(b[:]))
	if g != h {
		t.Fatalf("round trip %+v, want %+v", g, h)
	}
	_, err = h.MarshalTo(b[:frame.HeaderSize-1])
	wantErr(t, err, rtrs.ErrShortBuffer)
	wantErr(t, g.Unmarshal(b[:3]), rtrs.ErrTruncated)
}

func TestCtrlImm(t *testing.T) {
	if got := frame.CtrlConnReq.Imm(); got != 0xF0000001 {
		t.Fatalf("ConnReq imm %#x", got)
	}
	if typ, _ := rtrs.SplitImm(frame.CtrlInfoRsp.Imm()); typ.Known() {
		t.Fatalf("control type %d collides with an RTRS immediate type", typ)
	}
	_, err := frame.CtrlHeader(frame.CtrlKind(9), 0)
	wantErr(t, err, rtrs.ErrBadType)
	_, err = frame.CtrlHeader(frame.CtrlConnReq, frame.MaxCtrlLen+1)
	wantErr(t, err, rtrs.ErrMsgSize)
}

func TestIOHeaders(t *testing.T) {
	c := frametest.Codec(t)
	// WRITE of 4096 bytes with a 32-byte user message into chunk 3: payload
	// from 0, header at 4128, as over RDMA.
	f := frametest.WriteReq(t, c, 3, make([]byte, 4096), make([]byte, 32))
	im, err := c.Decode(f.H.Imm)
	mustNoErr(t, err)
	if im.Type != rtrs.ImmIOReq || im.BufID != 3 || im.Off != 4128 || f.H.Off != 0 || f.H.Len != 4132 {
		t.Fatalf("write header %+v imm %+v", f.H, im)
	}
	// READ of 4096 bytes: payload = user message + header + 1 desc from 4096.
	f = frametest.ReadReq(t, c, 4, 4096, make([]byte, 32))
	im, err = c.Decode(f.H.Imm)
	mustNoErr(t, err)
	if im.BufID != 4 || im.Off != 4128 || f.H.Off != 4096 || f.H.Len != 32+8+16 {
		t.Fatalf("read header %+v imm %+v", f.H, im)
	}

	h, err := frame.IORspHeader(c, 5, 0, 4096)
	mustNoErr(t, err)
	if h.Imm != 0x10000005 || h.Len != 4096 {
		t.Fatalf("io_rsp header %+v", h)
	}
	_, err = frame.IORspHeader(c, 5, -5, 1)
	wantErr(t, err, rtrs.ErrMsgSize)
	_, err = frame.IORspHeader(c, 5, 0, frametest.Chunk+1)
	wantErr(t, err, rtrs.ErrMsgSize)
	_, err = frame.IORspHeader(c, frametest.QD, 0, 0)
	wantErr(t, err, rtrs.ErrOutOfRange)

	if frame.HeartbeatHeader(false).Imm != 0x80000000 || frame.HeartbeatHeader(true).Imm != 0x90000000 {
		t.Fatal("heartbeat immediates")
	}

	// A layout whose payload would leave the chunk.
	_, err = frame.IOReqHeader(c, 1, rtrs.IOLayout{HdrOff: 100, WriteOff: 100, WriteLen: frametest.Chunk})
	wantErr(t, err, rtrs.ErrMsgSize)
}

func TestPutFrame(t *testing.T) {
	b := make([]byte, 64)
	_, err := frame.PutFrame(b, frame.Header{Len: 3}, []byte{1, 2})
	wantErr(t, err, rtrs.ErrOutOfRange)
	_, err = frame.PutFrame(b[:13], frame.Header{Len: 2}, []byte{1, 2})
	wantErr(t, err, rtrs.ErrShortBuffer)
	n, err := frame.PutFrame(b, frame.Header{Imm: 1, Len: 2}, []byte{1, 2})
	mustNoErr(t, err)
	if n != frame.HeaderSize+2 || b[12] != 1 || b[13] != 2 {
		t.Fatalf("PutFrame wrote % x", b[:n])
	}
	req := rtrs.ConnReq{CIDNum: 1}
	_, err = frame.PutCtrl(make([]byte, frame.HeaderSize+rtrs.ConnReqSize-1), frame.CtrlConnReq, &req)
	wantErr(t, err, rtrs.ErrShortBuffer)
	n, err = frame.PutCtrl(make([]byte, 100), frame.CtrlConnReq, &req)
	mustNoErr(t, err)
	if n != frame.HeaderSize+rtrs.ConnReqSize {
		t.Fatalf("PutCtrl returned %d", n)
	}
}
