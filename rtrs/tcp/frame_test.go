package tcp

import (
	"bytes"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
)

func TestHeaderWire(t *testing.T) {
	h := Header{Imm: 0x00181020, Len: 0x1234, Off: 0x10}
	var b [HeaderSize]byte
	n, err := h.MarshalTo(b[:])
	mustNoErr(t, err)
	want := []byte{0x20, 0x10, 0x18, 0x00, 0x34, 0x12, 0, 0, 0x10, 0, 0, 0}
	if n != HeaderSize || !bytes.Equal(b[:], want) {
		t.Fatalf("got % x, want % x", b[:n], want)
	}
	var g Header
	mustNoErr(t, g.Unmarshal(b[:]))
	if g != h {
		t.Fatalf("round trip %+v, want %+v", g, h)
	}
	_, err = h.MarshalTo(b[:HeaderSize-1])
	wantErr(t, err, rtrs.ErrShortBuffer)
	wantErr(t, g.Unmarshal(b[:3]), rtrs.ErrTruncated)
}

func TestCtrlImm(t *testing.T) {
	if got := CtrlConnReq.Imm(); got != 0xF0000001 {
		t.Fatalf("ConnReq imm %#x", got)
	}
	if typ, _ := rtrs.SplitImm(CtrlInfoRsp.Imm()); typ.Known() {
		t.Fatalf("control type %d collides with an RTRS immediate type", typ)
	}
	_, err := CtrlHeader(CtrlKind(9), 0)
	wantErr(t, err, rtrs.ErrBadType)
	_, err = CtrlHeader(CtrlConnReq, MaxCtrlLen+1)
	wantErr(t, err, rtrs.ErrMsgSize)
}

func TestIOHeaders(t *testing.T) {
	c := testCodec(t)
	// WRITE of 4096 bytes with a 32-byte user message into chunk 3: payload
	// from 0, header at 4128, as over RDMA.
	f := writeFrame(t, c, 3, make([]byte, 4096), make([]byte, 32))
	im, err := c.Decode(f.h.Imm)
	mustNoErr(t, err)
	if im.Type != rtrs.ImmIOReq || im.BufID != 3 || im.Off != 4128 || f.h.Off != 0 || f.h.Len != 4132 {
		t.Fatalf("write header %+v imm %+v", f.h, im)
	}
	// READ of 4096 bytes: payload = user message + header + 1 desc from 4096.
	f = readFrame(t, c, 4, 4096, make([]byte, 32))
	im, err = c.Decode(f.h.Imm)
	mustNoErr(t, err)
	if im.BufID != 4 || im.Off != 4128 || f.h.Off != 4096 || f.h.Len != 32+8+16 {
		t.Fatalf("read header %+v imm %+v", f.h, im)
	}

	h, err := IORspHeader(c, 5, 0, 4096)
	mustNoErr(t, err)
	if h.Imm != 0x10000005 || h.Len != 4096 {
		t.Fatalf("io_rsp header %+v", h)
	}
	_, err = IORspHeader(c, 5, -5, 1)
	wantErr(t, err, rtrs.ErrMsgSize)
	_, err = IORspHeader(c, 5, 0, testChunk+1)
	wantErr(t, err, rtrs.ErrMsgSize)
	_, err = IORspHeader(c, testQD, 0, 0)
	wantErr(t, err, rtrs.ErrOutOfRange)

	if HeartbeatHeader(false).Imm != 0x80000000 || HeartbeatHeader(true).Imm != 0x90000000 {
		t.Fatal("heartbeat immediates")
	}

	// A layout whose payload would leave the chunk.
	_, err = IOReqHeader(c, 1, rtrs.IOLayout{HdrOff: 100, WriteOff: 100, WriteLen: testChunk})
	wantErr(t, err, rtrs.ErrMsgSize)
}

func TestPutFrame(t *testing.T) {
	b := make([]byte, 64)
	_, err := PutFrame(b, Header{Len: 3}, []byte{1, 2})
	wantErr(t, err, rtrs.ErrOutOfRange)
	_, err = PutFrame(b[:13], Header{Len: 2}, []byte{1, 2})
	wantErr(t, err, rtrs.ErrShortBuffer)
	n, err := PutFrame(b, Header{Imm: 1, Len: 2}, []byte{1, 2})
	mustNoErr(t, err)
	if n != HeaderSize+2 || b[12] != 1 || b[13] != 2 {
		t.Fatalf("PutFrame wrote % x", b[:n])
	}
	req := rtrs.ConnReq{CIDNum: 1}
	_, err = PutCtrl(make([]byte, HeaderSize+rtrs.ConnReqSize-1), CtrlConnReq, &req)
	wantErr(t, err, rtrs.ErrShortBuffer)
	n, err = PutCtrl(make([]byte, 100), CtrlConnReq, &req)
	mustNoErr(t, err)
	if n != HeaderSize+rtrs.ConnReqSize {
		t.Fatalf("PutCtrl returned %d", n)
	}
}
