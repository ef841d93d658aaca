package rtrs

import (
	"testing"
)

func TestBitsFor(t *testing.T) {
	for _, c := range []struct {
		x    uint32
		want int
	}{{0, 0}, {1, 1}, {2, 2}, {3, 2}, {511, 9}, {512, 10}, {131071, 17}, {65534, 16}} {
		if got := BitsFor(c.x); got != c.want {
			t.Errorf("BitsFor(%d) = %d, want %d", c.x, got, c.want)
		}
	}
}

func TestImmCodecMemBits(t *testing.T) {
	for _, c := range []struct{ qd, chunk, mem int }{
		{512, 128 << 10, 19}, {1, 1 << 28, 28}, {2, 8192, 27}, {513, 8192, 18}, {65535, 4096, 12},
	} {
		ic, err := NewImmCodec(c.qd, c.chunk)
		mustNoErr(t, err)
		if ic.MemBits() != c.mem || ic.QueueDepth() != c.qd || ic.ChunkSize() != c.chunk {
			t.Errorf("qd %d: mem bits %d, want %d", c.qd, ic.MemBits(), c.mem)
		}
	}
	for _, c := range []struct{ qd, chunk int }{
		{0, 8192}, {65536, 8192}, {512, 0}, {512, 1 << 20}, {65535, 8192}, {1, 1<<28 + 1},
	} {
		_, err := NewImmCodec(c.qd, c.chunk)
		wantErr(t, err, ErrOutOfRange)
	}
}

// §11 of the wire doc: qd 512, chunk 128 KiB, buffer 3.
func TestImmWorkedExamples(t *testing.T) {
	ic, err := NewImmCodec(512, 128<<10)
	mustNoErr(t, err)

	imm, err := ic.IOReq(3, 0x1020)
	mustNoErr(t, err)
	if imm != 0x00181020 {
		t.Fatalf("IO_REQ imm = %#08x, want 0x00181020", imm)
	}
	d, err := ic.Decode(imm)
	mustNoErr(t, err)
	if d != (Imm{Type: ImmIOReq, BufID: 3, Off: 0x1020}) {
		t.Fatalf("decode = %+v", d)
	}

	// OPEN: header at 320; CLOSE: header at 8.
	if imm, _ := ic.IOReq(3, 320); imm != 0x00180140 {
		t.Errorf("OPEN imm = %#08x", imm)
	}
	if imm, _ := ic.IOReq(3, 8); imm != 0x00180008 {
		t.Errorf("CLOSE imm = %#08x", imm)
	}

	for _, c := range []struct {
		id    uint32
		errno int
		inv   bool
		want  uint32
	}{
		{3, 0, false, 0x10000003},
		{5, 0, false, 0x10000005},
		{5, -5, false, 0x10280005}, // -EIO
		{5, 5, false, 0x10280005},  // positive accepted, like abs()
		{3, 0, true, 0x20000003},
		{511, -511, true, 0x2FF801FF},
	} {
		got, err := ic.IORsp(c.id, c.errno, c.inv)
		mustNoErr(t, err)
		if got != c.want {
			t.Errorf("IORsp(%d,%d,%v) = %#08x, want %#08x", c.id, c.errno, c.inv, got, c.want)
		}
		d, err := ic.Decode(got)
		mustNoErr(t, err)
		wantT := ImmIORsp
		if c.inv {
			wantT = ImmIORspWInv
		}
		e := c.errno
		if e > 0 {
			e = -e
		}
		if d != (Imm{Type: wantT, BufID: c.id, Errno: e}) {
			t.Errorf("decode %#x = %+v", got, d)
		}
	}

	if HeartbeatImm != 0x80000000 || HeartbeatAckImm != 0x90000000 {
		t.Fatalf("heartbeat imms %#x %#x", HeartbeatImm, HeartbeatAckImm)
	}
	for imm, want := range map[uint32]ImmType{0x80000000: ImmHBMsg, 0x90000000: ImmHBAck, 0x8000FFFF: ImmHBMsg} {
		d, err := ic.Decode(imm)
		mustNoErr(t, err)
		if d != (Imm{Type: want}) {
			t.Errorf("decode %#x = %+v", imm, d)
		}
		e, err := ic.Encode(d)
		mustNoErr(t, err)
		if e != uint32(want)<<28 {
			t.Errorf("encode %+v = %#x", d, e)
		}
	}
}

func TestImmRejects(t *testing.T) {
	ic, err := NewImmCodec(512, 128<<10)
	mustNoErr(t, err)

	_, err = ic.IOReq(512, 0)
	wantErr(t, err, ErrOutOfRange)
	_, err = ic.IOReq(0, 128<<10)
	wantErr(t, err, ErrOutOfRange)
	_, err = ImmCodec{}.IOReq(0, 0)
	wantErr(t, err, ErrOutOfRange)
	_, err = ic.IORsp(512, 0, false)
	wantErr(t, err, ErrOutOfRange)
	_, err = ic.IORsp(1, -512, false)
	wantErr(t, err, ErrOutOfRange)
	_, err = IORspImm(1<<19, 0, false)
	wantErr(t, err, ErrOutOfRange)
	_, err = IORspImm(0, -int(^uint(0)>>1)-1, false) // MinInt
	wantErr(t, err, ErrOutOfRange)

	// qd 500, chunk 8192 (mem bits 19): buf_id 511 >= qd.
	ic2, _ := NewImmCodec(500, 8192)
	_, err = ic2.Decode(0x0FF80000)
	wantErr(t, err, ErrOutOfRange)
	// offset 0x2000 >= chunk.
	_, err = ic2.Decode(0x00002000)
	wantErr(t, err, ErrOutOfRange)
	// msg_id >= qd.
	_, err = ic.Decode(0x10000200)
	wantErr(t, err, ErrOutOfRange)
	// Unknown types.
	for _, imm := range []uint32{0x30000000, 0x70000000, 0xA0000000, 0xF0000000} {
		_, err = ic.Decode(imm)
		wantErr(t, err, ErrBadType)
	}
	// Zero codec never panics.
	_, err = ImmCodec{}.Decode(0)
	wantErr(t, err, ErrOutOfRange)

	_, err = ic.Encode(Imm{Type: 3})
	wantErr(t, err, ErrBadType)
	_, err = ic.Encode(Imm{Type: ImmHBMsg, BufID: 1})
	wantErr(t, err, ErrOutOfRange)
	_, err = ic.Encode(Imm{Type: ImmIOReq, Errno: -1})
	wantErr(t, err, ErrOutOfRange)
	_, err = ic.Encode(Imm{Type: ImmIORsp, Off: 1})
	wantErr(t, err, ErrOutOfRange)

	_, err = MakeImm(16, 0)
	wantErr(t, err, ErrOutOfRange)
	_, err = MakeImm(1, 1<<28)
	wantErr(t, err, ErrOutOfRange)
	imm, err := MakeImm(ImmIORspWInv, 0x0FFFFFFF)
	mustNoErr(t, err)
	if tt, p := SplitImm(imm); imm != 0x2FFFFFFF || tt != ImmIORspWInv || p != 0x0FFFFFFF {
		t.Fatalf("MakeImm/SplitImm: %#x %v %#x", imm, tt, p)
	}
}

func TestImmTypeStrings(t *testing.T) {
	for tt, s := range map[ImmType]string{ImmIOReq: "IO_REQ", ImmIORsp: "IO_RSP", ImmIORspWInv: "IO_RSP_W_INV", ImmHBMsg: "HB_MSG", ImmHBAck: "HB_ACK", 5: "ImmType(5)"} {
		if tt.String() != s {
			t.Errorf("%d: %q", tt, tt.String())
		}
		if tt.Known() != (s[0] != 'I' || s[1] == 'O') {
			t.Errorf("%d: Known = %v", tt, tt.Known())
		}
	}
}

func FuzzImm(f *testing.F) {
	f.Add(uint32(0x00181020), uint16(512), uint8(17))
	f.Add(uint32(0x10000003), uint16(512), uint8(17))
	f.Add(uint32(0x10280005), uint16(512), uint8(17))
	f.Add(uint32(0x20000003), uint16(512), uint8(17))
	f.Add(uint32(0x80000000), uint16(1), uint8(13))
	f.Add(uint32(0x90000000), uint16(65535), uint8(12))
	f.Add(uint32(0xFFFFFFFF), uint16(3), uint8(20))
	f.Fuzz(func(t *testing.T, imm uint32, qd uint16, chunkShift uint8) {
		ic, err := NewImmCodec(int(qd), 1<<(chunkShift%29))
		if err != nil {
			return
		}
		d, err := ic.Decode(imm)
		if err != nil {
			return
		}
		re, err := ic.Encode(d)
		if err != nil {
			t.Fatalf("decoded %#x to %+v, re-encode failed: %v", imm, d, err)
		}
		d2, err := ic.Decode(re)
		if err != nil || d2 != d {
			t.Fatalf("%#x -> %+v -> %#x -> %+v, %v", imm, d, re, d2, err)
		}
		if d.Type != ImmHBMsg && d.Type != ImmHBAck && re != imm {
			t.Fatalf("IO imm %#x re-encoded as %#x", imm, re)
		}
	})
}
