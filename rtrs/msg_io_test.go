package rtrs

import (
	"bytes"
	"reflect"
	"testing"
)

const (
	exChunk  = 128 << 10
	exMaxHdr = 4096
)

func TestRdmaWriteMsg(t *testing.T) {
	m := RdmaWriteMsg{UsrLen: 32}
	b := make([]byte, 4)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 4 || m.Size() != 4 || !bytes.Equal(b, hx(t, "02 00 20 00")) {
		t.Fatalf("% x", b)
	}
	var d RdmaWriteMsg
	mustNoErr(t, d.Unmarshal(b))
	if d != m {
		t.Fatal(d)
	}
	wantErr(t, d.Unmarshal(b[:3]), ErrTruncated)
	wantErr(t, d.Unmarshal(hx(t, "03 00 20 00")), ErrBadType)
	_, err = m.MarshalTo(b[:3])
	wantErr(t, err, ErrShortBuffer)
}

func TestRdmaReadMsg(t *testing.T) {
	m := RdmaReadMsg{UsrLen: 32, Flags: FlagNeedInval, Desc: []SGDesc{{Addr: 0xAABB000, Key: 0x1234, Len: 4096}}}
	want := hx(t, "03 00 20 00 01 00 01 00  00 b0 ab 0a 00 00 00 00  34 12 00 00 00 10 00 00")
	b := make([]byte, 30)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 24 || m.Size() != 24 || !bytes.Equal(b[:n], want) {
		t.Fatalf("% x", b[:n])
	}
	var d RdmaReadMsg
	mustNoErr(t, d.Unmarshal(b))
	if !reflect.DeepEqual(d, m) {
		t.Fatalf("%+v", d)
	}
	// Flush: no descriptors, flags 0.
	f := RdmaReadMsg{UsrLen: 32}
	n, err = f.MarshalTo(b)
	mustNoErr(t, err)
	if n != 8 || !bytes.Equal(b[:8], hx(t, "03 00 20 00 00 00 00 00")) {
		t.Fatalf("% x", b[:8])
	}
	mustNoErr(t, d.Unmarshal(b[:8]))
	if d.UsrLen != 32 || d.Flags != 0 || len(d.Desc) != 0 {
		t.Fatalf("%+v", d)
	}

	wantErr(t, d.Unmarshal(want[:7]), ErrTruncated)
	wantErr(t, d.Unmarshal(want[:23]), ErrTruncated)
	x := bytes.Clone(want)
	x[0] = 2
	wantErr(t, d.Unmarshal(x), ErrBadType)
	x = bytes.Clone(want)
	x[20], x[21] = 0, 0
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	_, err = m.MarshalTo(b[:23])
	wantErr(t, err, ErrShortBuffer)
	_, err = (&RdmaReadMsg{Desc: []SGDesc{{}}}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	_, err = (&RdmaReadMsg{Desc: make([]SGDesc, 65536)}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
}

func TestRkeyRsp(t *testing.T) {
	m := RkeyRsp{BufID: 3, RKey: 0x00ABCD01}
	b := make([]byte, 8)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 8 || m.Size() != 8 || !bytes.Equal(b, hx(t, "04 00 03 00 01 cd ab 00")) {
		t.Fatalf("% x", b)
	}
	var d RkeyRsp
	mustNoErr(t, d.Unmarshal(b))
	if d != m {
		t.Fatal(d)
	}
	mustNoErr(t, d.CheckBufID(512, 3))
	wantErr(t, d.CheckBufID(3, 3), ErrOutOfRange)
	wantErr(t, d.CheckBufID(512, 4), ErrOutOfRange)
	wantErr(t, d.Unmarshal(b[:7]), ErrTruncated)
	b[0] = 1
	wantErr(t, d.Unmarshal(b), ErrBadType)
	_, err = m.MarshalTo(b[:7])
	wantErr(t, err, ErrShortBuffer)

	if IncRkey(0x00ABCD01) != 0x00ABCD02 || IncRkey(0x123456FF) != 0x12345600 {
		t.Fatal("IncRkey")
	}
}

// usrIO is a stand-in 32-byte RNBD IO message.
func usrIO() []byte {
	u := make([]byte, 32)
	u[0] = 4
	for i := 4; i < 32; i++ {
		u[i] = byte(i)
	}
	return u
}

// §11: 4 KiB write into buffer 3.
func TestWriteRequestExample(t *testing.T) {
	l, err := WriteLayout(4096, 32, exChunk, exMaxHdr)
	mustNoErr(t, err)
	if l != (IOLayout{Type: MsgWrite, DataLen: 4096, UsrLen: 32, HdrOff: 4128, HdrLen: 36, WriteOff: 0, WriteLen: 4132}) || l.UsrOff() != 4096 {
		t.Fatalf("layout %+v", l)
	}
	chunk := make([]byte, exChunk)
	data := bytes.Repeat([]byte{0x5A}, 4096)
	off, err := PutWriteReq(chunk, data, usrIO())
	mustNoErr(t, err)
	if off != 0x1020 {
		t.Fatalf("off %#x", off)
	}
	if !bytes.Equal(chunk[4128:4132], hx(t, "02 00 20 00")) {
		t.Fatalf("header % x", chunk[4128:4132])
	}
	ic, _ := NewImmCodec(512, exChunk)
	imm, _ := ic.IOReq(3, off)
	if imm != 0x00181020 {
		t.Fatalf("imm %#x", imm)
	}
	di, err := ic.Decode(imm)
	mustNoErr(t, err)
	r, err := ParseIOReq(chunk, di.Off)
	mustNoErr(t, err)
	if r.Type != MsgWrite || r.Off != 4128 || !bytes.Equal(r.Data, data) || !bytes.Equal(r.Usr, usrIO()) ||
		r.Flags != 0 || r.Descs.Len() != 0 || cap(r.Data) != 4096 || cap(r.Usr) != 32 {
		t.Fatalf("parsed %v %d %d %d", r.Type, r.Off, len(r.Data), len(r.Usr))
	}
}

// §11: 4 KiB read into buffer 3.
func TestReadRequestExample(t *testing.T) {
	l, err := ReadLayout(4096, 32, 1, exChunk, exMaxHdr)
	mustNoErr(t, err)
	if l != (IOLayout{Type: MsgRead, DataLen: 4096, UsrLen: 32, SGCnt: 1, HdrOff: 4128, HdrLen: 56, WriteOff: 4096, WriteLen: 56}) {
		t.Fatalf("layout %+v", l)
	}
	chunk := make([]byte, exChunk)
	desc := SGDesc{Addr: 0x7f0000001000, Key: 0x4567, Len: 4096}
	off, err := PutReadReq(chunk, 4096, usrIO(), FlagNeedInval, []SGDesc{desc})
	mustNoErr(t, err)
	if off != 4128 || !bytes.Equal(chunk[4128:4136], hx(t, "03 00 20 00 01 00 01 00")) {
		t.Fatalf("off %d header % x", off, chunk[4128:4136])
	}
	r, err := ParseIOReq(chunk, off)
	mustNoErr(t, err)
	if r.Type != MsgRead || len(r.Data) != 4096 || !bytes.Equal(r.Usr, usrIO()) || r.Flags != FlagNeedInval ||
		r.Descs.Len() != 1 || r.Descs.At(0) != desc {
		t.Fatalf("parsed %+v", r)
	}
	// The same header through RdmaReadMsg.
	var h RdmaReadMsg
	mustNoErr(t, h.Unmarshal(chunk[off:]))
	if h.UsrLen != 32 || h.Flags != FlagNeedInval || h.Desc[0] != desc {
		t.Fatalf("%+v", h)
	}
}

// §11: OPEN (264-byte user message, 56-byte reply buffer) and CLOSE.
func TestOpenCloseExamples(t *testing.T) {
	l, err := ReadLayout(56, 264, 1, exChunk, exMaxHdr)
	mustNoErr(t, err)
	if l.HdrOff != 320 || l.WriteOff != 56 || l.HdrLen != 264+8+16 {
		t.Fatalf("%+v", l)
	}
	chunk := make([]byte, exChunk)
	usr := make([]byte, 264)
	usr[0] = 2
	off, err := PutReadReq(chunk, 56, usr, FlagNeedInval, []SGDesc{{Addr: 1, Key: 2, Len: 56}})
	mustNoErr(t, err)
	if off != 320 || !bytes.Equal(chunk[320:328], hx(t, "03 00 08 01 01 00 01 00")) {
		t.Fatalf("open header % x", chunk[320:328])
	}
	r, err := ParseIOReq(chunk, off)
	mustNoErr(t, err)
	if len(r.Data) != 56 || len(r.Usr) != 264 || r.Descs.At(0).Len != 56 {
		t.Fatalf("%+v", r)
	}

	l, err = WriteLayout(0, 8, exChunk, exMaxHdr)
	mustNoErr(t, err)
	if l.HdrOff != 8 || l.WriteLen != 12 {
		t.Fatalf("%+v", l)
	}
	clear(chunk)
	off, err = PutWriteReq(chunk, nil, hx(t, "05 00 00 00 07 00 00 00"))
	mustNoErr(t, err)
	if off != 8 || !bytes.Equal(chunk[:12], hx(t, "05 00 00 00 07 00 00 00 02 00 08 00")) {
		t.Fatalf("close % x", chunk[:12])
	}
	r, err = ParseIOReq(chunk, off)
	mustNoErr(t, err)
	if len(r.Data) != 0 || len(r.Usr) != 8 {
		t.Fatalf("%+v", r)
	}
}

func TestLayoutLimits(t *testing.T) {
	// Largest write: D = chunk - U - 4.
	_, err := WriteLayout(exChunk-36, 32, exChunk, exMaxHdr)
	mustNoErr(t, err)
	_, err = WriteLayout(exChunk-35, 32, exChunk, exMaxHdr)
	wantErr(t, err, ErrMsgSize)
	_, err = WriteLayout(0, exMaxHdr-3, exChunk, exMaxHdr)
	wantErr(t, err, ErrMsgSize)
	_, err = WriteLayout(0, exMaxHdr-4, exChunk, exMaxHdr)
	mustNoErr(t, err)
	_, err = ReadLayout(exChunk-56, 32, 1, exChunk, exMaxHdr)
	mustNoErr(t, err)
	_, err = ReadLayout(exChunk-55, 32, 1, exChunk, exMaxHdr)
	wantErr(t, err, ErrMsgSize)
	_, err = ReadLayout(0, 32, 254, exChunk, exMaxHdr) // 32+8+16*254 = 4104 > 4096
	wantErr(t, err, ErrMsgSize)
	_, err = WriteLayout(-1, 0, exChunk, exMaxHdr)
	wantErr(t, err, ErrMsgSize)
	_, err = WriteLayout(0, 65536, 1<<20, 1<<20)
	wantErr(t, err, ErrOutOfRange)
	_, err = ReadLayout(0, 0, -1, exChunk, exMaxHdr)
	wantErr(t, err, ErrOutOfRange)

	_, err = PutWriteReq(make([]byte, 39), make([]byte, 4), make([]byte, 32))
	wantErr(t, err, ErrMsgSize)
	_, err = PutWriteReq(make([]byte, 1<<17), nil, make([]byte, 65536))
	wantErr(t, err, ErrOutOfRange)
	_, err = PutReadReq(make([]byte, 63), 8, make([]byte, 32), 0, []SGDesc{{Len: 1}})
	wantErr(t, err, ErrMsgSize)
	_, err = PutReadReq(make([]byte, 64), -1, nil, 0, nil)
	wantErr(t, err, ErrOutOfRange)
	_, err = PutReadReq(make([]byte, 64), 8, nil, 0, []SGDesc{{}})
	wantErr(t, err, ErrOutOfRange)
}

func TestParseIOReqRejects(t *testing.T) {
	mk := func(hdr string, off int, size int) []byte {
		c := make([]byte, size)
		copy(c[off:], hx(t, hdr))
		return c
	}
	for _, c := range []struct {
		name  string
		chunk []byte
		off   uint32
		err   error
	}{
		{"off at end", make([]byte, 64), 64, ErrOutOfRange},
		{"off far out", make([]byte, 64), 0xFFFFFFF, ErrOutOfRange},
		{"empty chunk", nil, 0, ErrOutOfRange},
		{"type cut", mk("02", 63, 64), 63, ErrTruncated},
		{"write cut", mk("02 00 20", 61, 64), 61, ErrTruncated},
		{"read cut", mk("03 00 20 00 00 00", 58, 64), 58, ErrTruncated},
		{"descs cut", mk("03 00 20 00 01 00 02 00", 32, 64), 32, ErrTruncated},
		{"bad type 0", mk("00 00 00 00", 8, 64), 8, ErrBadType},
		{"bad type 4", mk("04 00 00 00", 8, 64), 8, ErrBadType},
		{"bad type 0x0102", mk("02 01 00 00", 8, 64), 8, ErrBadType},
		{"usr_len > off (write)", mk("02 00 09 00", 8, 64), 8, ErrOutOfRange},
		{"usr_len > off (read)", mk("03 00 09 00 00 00 00 00", 8, 64), 8, ErrOutOfRange},
		{"desc len 0", mk("03 00 08 00 01 00 01 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00", 8, 64), 8, ErrOutOfRange},
		{"desc len > chunk", mk("03 00 08 00 01 00 01 00 00 00 00 00 00 00 00 00 01 00 00 00 41 00 00 00", 8, 64), 8, ErrOutOfRange},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseIOReq(c.chunk, c.off)
			wantErr(t, err, c.err)
			if !reflect.DeepEqual(r, IOReq{}) {
				t.Fatal("non-zero result on error")
			}
		})
	}
	// Boundaries that are fine: header ending exactly at the chunk end, desc len == chunk.
	_, err := ParseIOReq(mk("02 00 3c 00", 60, 64), 60)
	mustNoErr(t, err)
	_, err = ParseIOReq(mk("03 00 08 00 01 00 01 00 00 00 00 00 00 00 00 00 01 00 00 00 40 00 00 00", 40, 64), 40)
	mustNoErr(t, err)
	// sg_cnt above the kernel server's limit is parsed; the caller decides.
	r, err := ParseIOReq(mk("03 00 00 00 00 00 02 00 00 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00", 0, 64), 0)
	mustNoErr(t, err)
	if r.Descs.Len() != 2 {
		t.Fatal(r.Descs.Len())
	}
}

func FuzzRdmaWriteMsg(f *testing.F) {
	f.Add([]byte{2, 0, 32, 0})
	f.Add([]byte{2, 0, 32})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m RdmaWriteMsg
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, RdmaWriteMsgSize)
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatal(err)
		}
		var m2 RdmaWriteMsg
		if err := m2.Unmarshal(out); err != nil || m2 != m || !bytes.Equal(out, b[:4]) {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}

func FuzzRdmaReadMsg(f *testing.F) {
	f.Add([]byte{3, 0, 32, 0, 1, 0, 1, 0, 0, 0xb0, 0xab, 0x0a, 0, 0, 0, 0, 0x34, 0x12, 0, 0, 0, 0x10, 0, 0})
	f.Add([]byte{3, 0, 32, 0, 0, 0, 0, 0})
	f.Add([]byte{3, 0, 32, 0, 0, 0, 9, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m RdmaReadMsg
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, m.Size())
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatal(err)
		}
		var m2 RdmaReadMsg
		if err := m2.Unmarshal(out); err != nil || !reflect.DeepEqual(m2, m) || !bytes.Equal(out, b[:len(out)]) {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}

func FuzzRkeyRsp(f *testing.F) {
	f.Add([]byte{4, 0, 3, 0, 1, 0xcd, 0xab, 0})
	f.Add([]byte{4, 0, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m RkeyRsp
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, RkeyRspSize)
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatal(err)
		}
		var m2 RkeyRsp
		if err := m2.Unmarshal(out); err != nil || m2 != m || !bytes.Equal(out, b[:8]) {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}

func FuzzSGDesc(f *testing.F) {
	f.Add([]byte{8, 7, 6, 5, 4, 3, 2, 1, 0x44, 0x33, 0x22, 0x11, 0, 0x10, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d SGDesc
		if d.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, SGDescSize)
		if _, err := d.MarshalTo(out); err != nil || !bytes.Equal(out, b[:16]) {
			t.Fatalf("%+v: % x (%v)", d, out, err)
		}
	})
}

// FuzzIOReq feeds arbitrary chunks and offsets to ParseIOReq; whatever it
// accepts is rebuilt with PutWriteReq/PutReadReq into a fresh chunk of the
// same size and must parse to the same request.
func FuzzIOReq(f *testing.F) {
	chunk := make([]byte, 256)
	off, _ := PutWriteReq(chunk, bytes.Repeat([]byte{1}, 100), usrIO())
	f.Add(bytes.Clone(chunk), off)
	clear(chunk)
	off, _ = PutReadReq(chunk, 64, usrIO(), FlagNeedInval, []SGDesc{{Addr: 9, Key: 8, Len: 64}})
	f.Add(bytes.Clone(chunk), off)
	clear(chunk)
	off, _ = PutReadReq(chunk, 0, usrIO(), 0, nil)
	f.Add(bytes.Clone(chunk), off)
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0xFF, 0xFF}, uint32(0))
	f.Fuzz(func(t *testing.T, chunk []byte, off uint32) {
		r, err := ParseIOReq(chunk, off)
		if err != nil {
			return
		}
		if uint64(len(r.Data))+uint64(len(r.Usr)) != uint64(off) || off >= uint32(len(chunk)) {
			t.Fatalf("bad slices: data %d usr %d off %d", len(r.Data), len(r.Usr), off)
		}
		c2 := make([]byte, len(chunk))
		var off2 uint32
		switch r.Type {
		case MsgWrite:
			off2, err = PutWriteReq(c2, r.Data, r.Usr)
		case MsgRead:
			off2, err = PutReadReq(c2, len(r.Data), r.Usr, r.Flags, r.Descs.AppendTo(nil))
		default:
			t.Fatalf("accepted type %v", r.Type)
		}
		if err != nil || off2 != off {
			t.Fatalf("re-encode: off %d vs %d, %v", off2, off, err)
		}
		if r.Type == MsgRead {
			copy(c2, r.Data) // PutReadReq leaves the data area alone
		}
		r2, err := ParseIOReq(c2, off2)
		if err != nil || !reflect.DeepEqual(r2, r) {
			t.Fatalf("re-parse: %+v vs %+v, %v", r2, r, err)
		}
	})
}
