package rtrs

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestSGDesc(t *testing.T) {
	d := SGDesc{Addr: 0x0102030405060708, Key: 0x11223344, Len: 4096}
	want := hx(t, "08 07 06 05 04 03 02 01 44 33 22 11 00 10 00 00")
	b := make([]byte, 16)
	n, err := d.MarshalTo(b)
	mustNoErr(t, err)
	if n != 16 || d.Size() != 16 || !bytes.Equal(b, want) {
		t.Fatalf("got % x", b)
	}
	var e SGDesc
	mustNoErr(t, e.Unmarshal(b))
	if e != d {
		t.Fatalf("%+v", e)
	}
	wantErr(t, e.Unmarshal(b[:15]), ErrTruncated)
	_, err = d.MarshalTo(b[:15])
	wantErr(t, err, ErrShortBuffer)

	v := SGDescs(append(bytes.Clone(want), want...))
	if v.Len() != 2 || v.At(1) != d {
		t.Fatalf("view: %d %+v", v.Len(), v.At(1))
	}
	if got := v.AppendTo(nil); !reflect.DeepEqual(got, []SGDesc{d, d}) {
		t.Fatalf("AppendTo: %+v", got)
	}
}

func TestInfoReq(t *testing.T) {
	var m InfoReq
	mustNoErr(t, m.SetName("blya"))
	b := bytes.Repeat([]byte{0xEE}, 300)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	want := append(hx(t, "00 00 62 6c 79 61"), make([]byte, 266)...)
	if n != 272 || m.Size() != 272 || !bytes.Equal(b[:272], want) || b[272] != 0xEE {
		t.Fatalf("marshal % x", b[:n])
	}
	var d InfoReq
	mustNoErr(t, d.Unmarshal(b))
	if d != m || d.NameString() != "blya" || string(d.NameBytes()) != "blya" {
		t.Fatalf("round trip %q", d.NameString())
	}

	// Longest name: 254 bytes.
	long := strings.Repeat("a", 254)
	mustNoErr(t, m.SetName(long))
	_, err = m.MarshalTo(b)
	mustNoErr(t, err)
	mustNoErr(t, d.Unmarshal(b))
	if d.NameString() != long {
		t.Fatal("long name")
	}
	wantErr(t, m.SetName(long+"a"), ErrOutOfRange)
	wantErr(t, m.SetName("a\x00b"), ErrOutOfRange)

	// Garbage after the NUL is dropped.
	x := bytes.Clone(want)
	x[100] = 'z'
	mustNoErr(t, d.Unmarshal(x))
	if d.NameString() != "blya" || d.Name[100] != 0 {
		t.Fatal("garbage after NUL kept")
	}

	wantErr(t, d.Unmarshal(want[:271]), ErrTruncated)
	x = bytes.Clone(want)
	x[0] = 1
	wantErr(t, d.Unmarshal(x), ErrBadType)
	x = bytes.Clone(want)
	for i := 2; i < 257; i++ {
		x[i] = 'q'
	}
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	var full InfoReq
	for i := range full.Name {
		full.Name[i] = 'q'
	}
	_, err = full.MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	if full.NameString() != strings.Repeat("q", 255) {
		t.Fatal("NameString of unterminated name")
	}
	_, err = m.MarshalTo(b[:271])
	wantErr(t, err, ErrShortBuffer)
}

func TestCheckSessName(t *testing.T) {
	for _, ok := range []string{"blya", "a", strings.Repeat("x", 254), "sess-1_A"} {
		mustNoErr(t, CheckSessName(ok))
	}
	for _, bad := range []string{"", "a/b", "a.b", ".", "a\x00", strings.Repeat("x", 255)} {
		wantErr(t, CheckSessName(bad), ErrOutOfRange)
	}
}

func TestCheckServerParams(t *testing.T) {
	mustNoErr(t, CheckServerParams(DefaultSessQueueDepth, DefaultMaxChunkSize))
	mustNoErr(t, CheckServerParams(4096, 65536)) // 12 + 16 bits
	mustNoErr(t, CheckServerParams(1, 1<<28))
	for _, c := range [][2]int{{65535, 8192}, {512, 4096}, {512, 12288}, {0, 8192}, {65536, 8192}, {2, 1 << 28}} {
		wantErr(t, CheckServerParams(c[0], c[1]), ErrOutOfRange)
	}
}

func TestInfoRsp(t *testing.T) {
	// always_invalidate: one MR per chunk.
	m := InfoRsp{Desc: []SGDesc{
		{Addr: 0x1000_0000, Key: 0x100, Len: 8192},
		{Addr: 0x2000_0000, Key: 0x200, Len: 8192},
	}}
	want := hx(t, "01 00 02 00 00 00 00 00"+
		"00 00 00 10 00 00 00 00 00 01 00 00 00 20 00 00"+
		"00 00 00 20 00 00 00 00 00 02 00 00 00 20 00 00")
	b := make([]byte, 64)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 40 || m.Size() != 8+16*2 || !bytes.Equal(b[:n], want) {
		t.Fatalf("marshal % x", b[:n])
	}
	d := InfoRsp{Desc: make([]SGDesc, 0, 4)}
	p := &d.Desc[:1][0]
	mustNoErr(t, d.Unmarshal(b))
	if !reflect.DeepEqual(d, m) || &d.Desc[0] != p {
		t.Fatalf("round trip %+v (capacity reused: %v)", d, &d.Desc[0] == p)
	}
	chunks, err := d.ChunkBufs(2, 8192, nil)
	mustNoErr(t, err)
	if !reflect.DeepEqual(chunks, []RemoteChunk{{0x1000_0000, 0x100}, {0x2000_0000, 0x200}}) {
		t.Fatalf("chunks %+v", chunks)
	}

	// always_invalidate=N: 2 MRs of 2 chunks each.
	m = InfoRsp{Desc: []SGDesc{{Addr: 0x10000, Key: 7, Len: 16384}, {Addr: 0x90000, Key: 8, Len: 16384}}}
	chunks, err = m.ChunkBufs(4, 8192, make([]RemoteChunk, 1, 8))
	mustNoErr(t, err)
	if !reflect.DeepEqual(chunks, []RemoteChunk{{0x10000, 7}, {0x12000, 7}, {0x90000, 8}, {0x92000, 8}}) {
		t.Fatalf("chunks %+v", chunks)
	}

	for _, c := range []struct {
		name  string
		descs []SGDesc
		qd    int
		chunk uint32
	}{
		{"qd not multiple of sg_cnt", []SGDesc{{Len: 8192}, {Len: 8192}, {Len: 16384}}, 4, 8192},
		{"len not multiple", []SGDesc{{Len: 8192}, {Len: 8000}}, 2, 8192},
		{"too little", []SGDesc{{Len: 16384}, {Len: 8192}}, 4, 8192},
		{"too much", []SGDesc{{Len: 16384}, {Len: 32768}}, 4, 8192},
		{"empty", nil, 4, 8192},
		{"imm does not fit", []SGDesc{{Len: 1 << 17}}, 4096, 1 << 17},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := InfoRsp{Desc: c.descs}
			_, err := m.ChunkBufs(c.qd, c.chunk, nil)
			wantErr(t, err, ErrOutOfRange)
		})
	}

	wantErr(t, d.Unmarshal(want[:7]), ErrTruncated)
	wantErr(t, d.Unmarshal(want[:39]), ErrTruncated)
	x := bytes.Clone(want)
	x[0] = 0
	wantErr(t, d.Unmarshal(x), ErrBadType)
	x = bytes.Clone(want)
	x[2] = 0
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	x = bytes.Clone(want)
	x[2] = 0xFF // sg_cnt 255 with 2 descriptors present
	wantErr(t, d.Unmarshal(x), ErrTruncated)
	x = bytes.Clone(want)
	x[36], x[37] = 0, 0 // desc[1].len = 0
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)

	_, err = (&InfoRsp{}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	_, err = (&InfoRsp{Desc: []SGDesc{{}}}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	_, err = (&InfoRsp{Desc: make([]SGDesc, 65536)}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	_, err = m.MarshalTo(b[:39])
	wantErr(t, err, ErrShortBuffer)
}

func FuzzInfoReq(f *testing.F) {
	var m InfoReq
	m.SetName("blya")
	b := make([]byte, InfoReqSize)
	m.MarshalTo(b)
	f.Add(b)
	f.Add(b[:100])
	m.Auth, m.ClientNonce, m.Proof[3] = true, NewNonce(), 7
	ab := make([]byte, m.Size())
	m.MarshalTo(ab)
	f.Add(ab)
	f.Add(ab[:len(ab)-1])
	f.Fuzz(func(t *testing.T, b []byte) {
		var m InfoReq
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, m.Size())
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatalf("accepted %q does not re-encode: %v", m.NameString(), err)
		}
		var m2 InfoReq
		if err := m2.Unmarshal(out); err != nil || m2 != m {
			t.Fatalf("re-decode %q != %q (%v)", m2.NameString(), m.NameString(), err)
		}
	})
}

func FuzzInfoRsp(f *testing.F) {
	m := InfoRsp{Desc: []SGDesc{{Addr: 0x10000, Key: 7, Len: 16384}, {Addr: 0x90000, Key: 8, Len: 16384}}}
	b := make([]byte, m.Size())
	m.MarshalTo(b)
	f.Add(b, uint16(4), uint8(13))
	f.Add(b[:8], uint16(4), uint8(13))
	m.Auth, m.Proof[0] = true, 0xAB
	ab := make([]byte, m.Size())
	m.MarshalTo(ab)
	f.Add(ab, uint16(4), uint8(13))
	f.Fuzz(func(t *testing.T, b []byte, qd uint16, chunkShift uint8) {
		var m InfoRsp
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, m.Size())
		if n, err := m.MarshalTo(out); err != nil || n != len(out) {
			t.Fatalf("accepted %+v does not re-encode: %v", m, err)
		}
		var m2 InfoRsp
		if err := m2.Unmarshal(out); err != nil || !reflect.DeepEqual(m2, m) {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
		chunk := uint32(1) << (chunkShift % 29)
		if cs, err := m.ChunkBufs(int(qd), chunk, nil); err == nil && len(cs) != int(qd) {
			t.Fatalf("ChunkBufs returned %d chunks for queue depth %d", len(cs), qd)
		}
	})
}

func TestInfoRspBufSize(t *testing.T) {
	if InfoRspBufSize(512) != 8+16*512+InfoRspAuthSize || InfoRspBufSize(1) != 24+InfoRspAuthSize {
		t.Fatal(InfoRspBufSize(512))
	}
}
