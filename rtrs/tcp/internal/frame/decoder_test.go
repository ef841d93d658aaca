package frame_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frametest"
)

// feedAll feeds stream to d in pieces of the sizes given by split (cycled)
// and returns the frames (copied) and the first error. With direct, the
// bytes of a started payload go straight into PayloadTail, as a reader
// that receives into the payload's buffer would put them, and Filled
// accounts for them.
func feedAll(d *frame.Decoder, stream []byte, split func() int, direct bool) ([]frametest.Frame, error) {
	var out []frametest.Frame
	for len(stream) > 0 {
		k := min(split(), len(stream))
		p := stream[:k]
		for len(p) > 0 {
			var n int
			var f *frame.Frame
			var err error
			if tail := d.PayloadTail(); direct && len(tail) > 0 {
				n = copy(tail, p)
				f, err = d.Filled(n)
			} else {
				n, f, err = d.Feed(p)
			}
			if err != nil {
				return out, err
			}
			p = p[n:]
			if f != nil {
				out = append(out, frametest.Frame{H: f.Header, P: bytes.Clone(f.Payload)})
			}
		}
		stream = stream[k:]
	}
	return out, d.End()
}

func serverDecoder(t testing.TB) *frame.Decoder {
	d := frame.NewDecoder(frame.ToServer)
	d.SetSession(frametest.Codec(t), nil)
	return d
}

func TestDecoderSplits(t *testing.T) {
	c := frametest.Codec(t)
	frames := []frametest.Frame{
		frametest.WriteReq(t, c, 1, bytes.Repeat([]byte{0xAB}, 1000), []byte("user message")),
		frametest.ReadReq(t, c, 5, 4096, make([]byte, 32)),
		{H: frame.HeartbeatHeader(false)},
		{H: frame.HeartbeatHeader(true)},
		frametest.WriteReq(t, c, 0, nil, []byte{1, 2, 3, 4, 5, 6, 7, 8}),
	}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, f.Bytes(t)...)
	}
	for _, direct := range []bool{false, true} {
		for _, size := range []int{1, 2, 3, 7, 11, 12, 13, 100, len(stream)} {
			got, err := feedAll(serverDecoder(t), stream, func() int { return size }, direct)
			mustNoErr(t, err)
			if len(got) != len(frames) {
				t.Fatalf("split %d, direct %v: %d frames, want %d", size, direct, len(got), len(frames))
			}
			for i := range got {
				if got[i].H != frames[i].H || !bytes.Equal(got[i].P, frames[i].P) {
					t.Fatalf("split %d, direct %v, frame %d: %+v, want %+v", size, direct, i, got[i].H, frames[i].H)
				}
			}
		}
	}
	// The same stream through ReadFrame.
	d := serverDecoder(t)
	r := bytes.NewReader(stream)
	for i := range frames {
		f, err := d.ReadFrame(r)
		mustNoErr(t, err)
		if f.Header != frames[i].H || !bytes.Equal(f.Payload, frames[i].P) {
			t.Fatalf("ReadFrame %d: %+v", i, f.Header)
		}
	}
	if _, err := d.ReadFrame(r); err != io.EOF {
		t.Fatalf("at end: %v, want io.EOF", err)
	}
}

// The decoded IO_REQ payload, put at its offset in a chunk, parses with
// rtrs.ParseIOReq exactly as an RDMA-written chunk would.
func TestDecoderIOReqParses(t *testing.T) {
	c := frametest.Codec(t)
	usr := []byte("0123456789abcdef0123456789abcdef")
	for _, f := range []frametest.Frame{
		frametest.WriteReq(t, c, 3, bytes.Repeat([]byte{1}, 4096), usr),
		frametest.ReadReq(t, c, 4, 4096, usr),
	} {
		var chunks [frametest.QD][frametest.Chunk]byte
		d := serverDecoder(t)
		d.SetSession(c, placerFunc(func(f *frame.Frame) ([]byte, error) {
			return chunks[f.Imm.BufID][f.Off:], nil
		}))
		got, err := d.ReadFrame(bytes.NewReader(f.Bytes(t)))
		mustNoErr(t, err)
		req, err := rtrs.ParseIOReq(chunks[got.Imm.BufID][:], got.Imm.Off)
		mustNoErr(t, err)
		if !bytes.Equal(req.Usr, usr) || len(req.Data) != 4096 {
			t.Fatalf("parsed %+v", req)
		}
	}
}

type placerFunc func(*frame.Frame) ([]byte, error)

func (p placerFunc) Place(f *frame.Frame) ([]byte, error) { return p(f) }

func TestDecoderRejects(t *testing.T) {
	c := frametest.Codec(t)
	ioReq, err := c.IOReq(1, 100)
	mustNoErr(t, err)
	ioRspErr, err := c.IORsp(1, -5, false)
	mustNoErr(t, err)
	ioRspInv, err := c.IORsp(1, 0, true)
	mustNoErr(t, err)
	for _, tc := range []struct {
		name string
		dir  frame.Direction
		sess bool
		h    frame.Header
		want error
	}{
		{"io before session", frame.ToServer, false, frame.Header{Imm: ioReq, Len: 104}, rtrs.ErrBadType},
		{"hb before session", frame.ToClient, false, frame.HeartbeatHeader(false), rtrs.ErrBadType},
		{"io_req to client", frame.ToClient, true, frame.Header{Imm: ioReq, Len: 104}, rtrs.ErrBadType},
		{"io_rsp to server", frame.ToServer, true, frame.Header{Imm: 0x10000001}, rtrs.ErrBadType},
		{"io_rsp_w_inv", frame.ToClient, true, frame.Header{Imm: ioRspInv}, rtrs.ErrBadType},
		{"unknown imm type", frame.ToServer, true, frame.Header{Imm: 0x50000000}, rtrs.ErrBadType},
		{"conn_rsp to server", frame.ToServer, false, frame.Header{Imm: frame.CtrlConnRsp.Imm(), Len: 56}, rtrs.ErrBadType},
		{"conn_req to client", frame.ToClient, false, frame.Header{Imm: frame.CtrlConnReq.Imm(), Len: 56}, rtrs.ErrBadType},
		{"unknown ctrl", frame.ToServer, false, frame.Header{Imm: frame.CtrlKind(77).Imm()}, rtrs.ErrBadType},
		{"ctrl too long", frame.ToServer, false, frame.Header{Imm: frame.CtrlConnReq.Imm(), Len: frame.MaxCtrlLen + 1}, rtrs.ErrMsgSize},
		{"ctrl with offset", frame.ToServer, false, frame.Header{Imm: frame.CtrlConnReq.Imm(), Len: 56, Off: 1}, rtrs.ErrOutOfRange},
		{"io_req past chunk", frame.ToServer, true, frame.Header{Imm: ioReq, Len: frametest.Chunk, Off: 100}, rtrs.ErrMsgSize},
		{"io_req huge len", frame.ToServer, true, frame.Header{Imm: ioReq, Len: 0xFFFFFFFF, Off: 100}, rtrs.ErrMsgSize},
		{"io_req huge off", frame.ToServer, true, frame.Header{Imm: ioReq, Len: 104, Off: 0xFFFFFFF0}, rtrs.ErrMsgSize},
		{"io_req header before payload", frame.ToServer, true, frame.Header{Imm: ioReq, Len: 10, Off: 101}, rtrs.ErrOutOfRange},
		{"io_req header past payload", frame.ToServer, true, frame.Header{Imm: ioReq, Len: 103}, rtrs.ErrOutOfRange},
		{"io_req bad buf id", frame.ToServer, true, frame.Header{Imm: frametest.QD << (rtrs.ImmPayloadBits - 3), Len: 4}, rtrs.ErrOutOfRange},
		{"io_rsp too long", frame.ToClient, true, frame.Header{Imm: 0x10000001, Len: frametest.Chunk + 1}, rtrs.ErrMsgSize},
		{"io_rsp with offset", frame.ToClient, true, frame.Header{Imm: 0x10000001, Off: 4}, rtrs.ErrOutOfRange},
		{"io_rsp error with data", frame.ToClient, true, frame.Header{Imm: ioRspErr, Len: 1}, rtrs.ErrOutOfRange},
		{"hb with payload", frame.ToServer, true, frame.Header{Imm: rtrs.HeartbeatImm, Len: 1}, rtrs.ErrOutOfRange},
		{"ack with offset", frame.ToClient, true, frame.Header{Imm: rtrs.HeartbeatAckImm, Off: 1}, rtrs.ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := frame.NewDecoder(tc.dir)
			if tc.sess {
				d.SetSession(c, nil)
			}
			var b [frame.HeaderSize]byte
			_, _ = tc.h.MarshalTo(b[:])
			_, f, err := d.Feed(b[:])
			if f != nil {
				t.Fatalf("accepted %+v", f.Header)
			}
			wantErr(t, err, tc.want)
			// Sticky: the decoder stays failed.
			_, _, err2 := d.Feed(b[:])
			if !errors.Is(err2, tc.want) || !errors.Is(d.End(), tc.want) {
				t.Fatalf("error not sticky: %v", err2)
			}
		})
	}
}

func TestDecoderTruncated(t *testing.T) {
	c := frametest.Codec(t)
	stream := frametest.WriteReq(t, c, 1, make([]byte, 100), nil).Bytes(t)
	for cut := 1; cut < len(stream); cut++ {
		_, err := feedAll(serverDecoder(t), stream[:cut], func() int { return 7 }, cut%2 == 0)
		wantErr(t, err, rtrs.ErrTruncated)
		_, err = serverDecoder(t).ReadFrame(bytes.NewReader(stream[:cut]))
		wantErr(t, err, rtrs.ErrTruncated)
	}
}

func TestDecoderPlacer(t *testing.T) {
	c := frametest.Codec(t)
	rspH, err := frame.IORspHeader(c, 5, 0, 512)
	mustNoErr(t, err)
	data := bytes.Repeat([]byte{0x5A}, 512)
	stream := frametest.Frame{H: rspH, P: data}.Bytes(t)

	var bufs [frametest.QD][4096]byte
	d := frame.NewDecoder(frame.ToClient)
	d.SetSession(c, placerFunc(func(f *frame.Frame) ([]byte, error) { return bufs[f.Imm.BufID][:], nil }))
	f, err := d.ReadFrame(bytes.NewReader(stream))
	mustNoErr(t, err)
	if &f.Payload[0] != &bufs[5][0] || !bytes.Equal(bufs[5][:512], data) {
		t.Fatal("payload not read into the placed buffer")
	}

	// A placer error or a too small buffer fails the decoder.
	d = frame.NewDecoder(frame.ToClient)
	d.SetSession(c, placerFunc(func(f *frame.Frame) ([]byte, error) { return make([]byte, 10), nil }))
	_, err = d.ReadFrame(bytes.NewReader(stream))
	wantErr(t, err, rtrs.ErrShortBuffer)
	boom := errors.New("no such request")
	d = frame.NewDecoder(frame.ToClient)
	d.SetSession(c, placerFunc(func(f *frame.Frame) ([]byte, error) { return nil, boom }))
	_, _, err = d.Feed(stream)
	wantErr(t, err, boom)
}

// FuzzFrameDecoder feeds arbitrary bytes, split at arbitrary points, to a
// decoder of either direction; it must never panic, must return only valid
// frames, and must agree with ReadFrame on the same bytes.
func FuzzFrameDecoder(f *testing.F) {
	c := frametest.Codec(f)
	seed := frametest.WriteReq(f, c, 1, []byte("data"), []byte("usr")).Bytes(f)
	seed = append(seed, frametest.ReadReq(f, c, 2, 64, []byte("usr")).Bytes(f)...)
	seed = append(seed, frametest.Frame{H: frame.HeartbeatHeader(false), P: nil}.Bytes(f)...)
	f.Add(seed, uint64(1), true)
	rsp, _ := frame.IORspHeader(c, 3, 0, 4)
	f.Add(frametest.Frame{H: rsp, P: []byte{1, 2, 3, 4}}.Bytes(f), uint64(7), false)
	var ctrl [frame.HeaderSize + frame.MaxCtrlLen]byte
	n, _ := frame.PutCtrl(ctrl[:], frame.CtrlConnReq, &rtrs.ConnReq{CIDNum: 2, CID: 1})
	f.Add(bytes.Clone(ctrl[:n]), uint64(3), true)
	f.Add([]byte{}, uint64(0), false)

	f.Fuzz(func(t *testing.T, data []byte, seed uint64, toServer bool) {
		dir := frame.ToClient
		if toServer {
			dir = frame.ToServer
		}
		mk := func() *frame.Decoder {
			d := frame.NewDecoder(dir)
			if seed&1 == 1 {
				d.SetSession(c, nil)
			}
			return d
		}
		rng := rand.New(rand.NewPCG(seed, seed>>32))
		got, ferr := feedAll(mk(), data, func() int { return 1 + rng.IntN(64) }, seed&2 != 0)
		for _, fr := range got {
			if int(fr.H.Len) != len(fr.P) {
				t.Fatalf("frame %+v with %d payload bytes", fr.H, len(fr.P))
			}
			if fr.H.Len > frame.MaxCtrlLen && fr.H.Len > frametest.Chunk {
				t.Fatalf("frame %+v over every limit", fr.H)
			}
		}
		// ReadFrame on the same bytes: the same frames, the same outcome.
		d := mk()
		r := bytes.NewReader(data)
		var rerr error
		for i := 0; ; i++ {
			fr, err := d.ReadFrame(r)
			if err != nil {
				if err != io.EOF {
					rerr = err
				}
				if i != len(got) {
					t.Fatalf("ReadFrame decoded %d frames, Feed %d", i, len(got))
				}
				break
			}
			if i >= len(got) || fr.Header != got[i].H || !bytes.Equal(fr.Payload, got[i].P) {
				t.Fatalf("ReadFrame frame %d differs", i)
			}
		}
		if (ferr == nil) != (rerr == nil) {
			t.Fatalf("Feed error %v, ReadFrame error %v", ferr, rerr)
		}
	})
}

// Filled refuses more bytes than the payload lacks, and outside a payload.
func TestDecoderFilledBounds(t *testing.T) {
	c := frametest.Codec(t)
	stream := frametest.WriteReq(t, c, 1, bytes.Repeat([]byte{1}, 100), []byte("usr")).Bytes(t)
	d := serverDecoder(t)
	if _, err := d.Filled(1); err == nil {
		t.Fatal("Filled before any header: no error")
	}
	d = serverDecoder(t)
	n, f, err := d.Feed(stream[:frame.HeaderSize+10])
	mustNoErr(t, err)
	if f != nil || n != frame.HeaderSize+10 {
		t.Fatalf("Feed of a partial frame: %d bytes, frame %v", n, f)
	}
	tail := d.PayloadTail()
	if want := len(stream) - frame.HeaderSize - 10; len(tail) != want {
		t.Fatalf("tail of %d bytes, want %d", len(tail), want)
	}
	if _, err := d.Filled(len(tail) + 1); err == nil {
		t.Fatal("Filled beyond the payload: no error")
	}
	if _, _, err := d.Feed(stream); err == nil {
		t.Fatal("the decoder went on after a bad Filled")
	}
}
