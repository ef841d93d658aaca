package rnbd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/urnbd/urnbd/internal/wiretest"
	"github.com/urnbd/urnbd/rtrs"
)

func TestSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"sess_info", (&SessInfo{}).Size(), 36},
		{"sess_info_rsp", (&SessInfoRsp{}).Size(), 36},
		{"open", (&Open{}).Size(), 264},
		{"open_rsp", (&OpenRsp{}).Size(), 56},
		{"close", (&Close{}).Size(), 8},
		{"io", (&IO{}).Size(), 32},
		{"hdr", (&MsgHdr{}).Size(), 4},
		{"rtrs conn_req", (&rtrs.ConnReq{}).Size(), 56},
		{"rtrs conn_rsp", (&rtrs.ConnRsp{}).Size(), 56},
		{"rtrs info_req", (&rtrs.InfoReq{}).Size(), 272},
		{"rtrs info_rsp n=3", (&rtrs.InfoRsp{Desc: make([]rtrs.SGDesc, 3)}).Size(), 8 + 16*3},
		{"rtrs rdma_read n=1", (&rtrs.RdmaReadMsg{Desc: make([]rtrs.SGDesc, 1)}).Size(), 8 + 16},
		{"rtrs rkey_rsp", (&rtrs.RkeyRsp{}).Size(), 8},
		{"rtrs rdma_write", (&rtrs.RdmaWriteMsg{}).Size(), 4},
	} {
		if c.got != c.want {
			t.Errorf("%s: size %d, want %d", c.name, c.got, c.want)
		}
	}
}

// §11: the rnbd_msg_io of a 4 KiB write.
func TestIO(t *testing.T) {
	m := IO{DeviceID: 7, Sector: 0x1000, RW: MakeRW(OpWrite, FlagSync|FlagFUA), BiSize: 4096, Prio: 0x4003}
	want := hx(t, "04 00 00 00 07 00 00 00 00 10 00 00 00 00 00 00 01 03 00 00 00 10 00 00 03 40 00 00 00 00 00 00")
	b := bytes.Repeat([]byte{0xEE}, 40)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 32 || !bytes.Equal(b[:32], want) || b[32] != 0xEE {
		t.Fatalf("marshal % x", b[:32])
	}
	var d IO
	mustNoErr(t, d.Unmarshal(b))
	if d != m {
		t.Fatalf("round trip %+v", d)
	}
	if m.RW.Op() != OpWrite || !m.RW.Sync() || !m.RW.FUA() || m.RW.Flags() != 0x300 || m.RW.String() != "WRITE|SYNC|FUA" {
		t.Fatalf("rw %v", m.RW)
	}
	// Padding is ignored.
	x := bytes.Clone(want)
	x[2], x[30] = 0xAA, 0xBB
	mustNoErr(t, d.Unmarshal(x))
	if d != m {
		t.Fatal("padding not ignored")
	}
	// Pre-prio 24-byte message: prio 0; a 31-byte one too.
	for _, l := range []int{24, 26, 31} {
		mustNoErr(t, d.Unmarshal(want[:l]))
		if d.Prio != 0 || d.BiSize != 4096 {
			t.Fatalf("len %d: %+v", l, d)
		}
	}
	wantErr(t, d.Unmarshal(want[:23]), ErrTruncated)
	x = bytes.Clone(want)
	x[0] = 5
	wantErr(t, d.Unmarshal(x), ErrBadType)
	x = bytes.Clone(want)
	x[16] = 6
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	_, err = (&IO{RW: 0xFF}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	_, err = m.MarshalTo(b[:31])
	wantErr(t, err, ErrShortBuffer)

	// Unknown flag bits survive.
	x = bytes.Clone(want)
	x[18] = 0x80
	mustNoErr(t, d.Unmarshal(x))
	if d.RW != 0x800301 || d.RW.String() != "WRITE|SYNC|FUA|0x800000" {
		t.Fatalf("rw %#x %v", uint32(d.RW), d.RW)
	}
}

func TestRWOps(t *testing.T) {
	for _, c := range []struct {
		op          IOOp
		name        string
		read, data  bool
		flags, want uint32
	}{
		{OpRead, "READ", true, true, FlagSync, 0x100},
		{OpWrite, "WRITE", false, true, 0, 0x1},
		{OpFlush, "FLUSH", true, false, FlagSync | FlagFUA, 0x302},
		{OpDiscard, "DISCARD", false, false, 0, 0x3},
		{OpSecureErase, "SECURE_ERASE", false, false, 0, 0x4},
		{OpWriteZeroes, "WRITE_ZEROES", false, false, FlagSync, 0x105},
	} {
		rw := MakeRW(c.op, c.flags)
		if uint32(rw) != c.want || rw.Op() != c.op || c.op.String() != c.name || c.op.RTRSRead() != c.read || c.op.HasData() != c.data || !c.op.Valid() {
			t.Errorf("%v: rw %#x", c.op, uint32(rw))
		}
	}
	if MakeRW(OpWrite, 0xFF|FlagFUA) != 0x201 {
		t.Error("MakeRW lets flags clobber the op")
	}
	if IOOp(6).Valid() || IOOp(6).String() != "IOOp(6)" {
		t.Error("op 6")
	}
}

func TestAccessMode(t *testing.T) {
	for _, c := range []struct {
		m AccessMode
		s string
		w bool
	}{{AccessRO, "ro", false}, {AccessRW, "rw", true}, {AccessMigration, "migration", true}} {
		p, err := ParseAccessMode(c.s)
		mustNoErr(t, err)
		if p != c.m || c.m.String() != c.s || c.m.Writable() != c.w || !c.m.Valid() {
			t.Errorf("%v", c.m)
		}
	}
	for _, bad := range []string{"", "RO", "rw ", "migrate", "read-only"} {
		_, err := ParseAccessMode(bad)
		wantErr(t, err, ErrOutOfRange)
	}
	if AccessMode(3).Valid() || AccessMode(3).String() != "AccessMode(3)" {
		t.Error("mode 3")
	}
}

func TestSessInfo(t *testing.T) {
	want := append(hx(t, "00 00 00 00 02"), make([]byte, 31)...)
	b := make([]byte, 36)
	n, err := (&SessInfo{Ver: ProtoVerMajor}).MarshalTo(b)
	mustNoErr(t, err)
	if n != 36 || !bytes.Equal(b, want) {
		t.Fatalf("% x", b)
	}
	var d SessInfo
	mustNoErr(t, d.Unmarshal(b))
	if d.Ver != 2 {
		t.Fatal(d)
	}
	wantErr(t, d.Unmarshal(b[:35]), ErrTruncated)
	wantErr(t, (&SessInfoRsp{}).Unmarshal(b), ErrBadType)

	n, err = (&SessInfoRsp{Ver: 1}).MarshalTo(b)
	mustNoErr(t, err)
	if n != 36 || !bytes.Equal(b, append(hx(t, "01 00 00 00 01"), make([]byte, 31)...)) {
		t.Fatalf("% x", b)
	}
	var r SessInfoRsp
	mustNoErr(t, r.Unmarshal(b))
	if r.Ver != 1 {
		t.Fatal(r)
	}
	wantErr(t, r.Unmarshal(b[:35]), ErrTruncated)
	wantErr(t, d.Unmarshal(b), ErrBadType)
	_, err = (&SessInfo{}).MarshalTo(b[:35])
	wantErr(t, err, ErrShortBuffer)
	_, err = (&SessInfoRsp{}).MarshalTo(b[:35])
	wantErr(t, err, ErrShortBuffer)
}

func TestOpen(t *testing.T) {
	var m Open
	m.AccessMode = AccessRW
	mustNoErr(t, m.SetDevName("/dev/ram0"))
	want := append(hx(t, "02 00 00 00 01 00 2f 64 65 76 2f 72 61 6d 30"), make([]byte, 264-15)...)
	b := make([]byte, 264)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 264 || !bytes.Equal(b, want) {
		t.Fatalf("% x", b[:20])
	}
	var d Open
	mustNoErr(t, d.Unmarshal(b))
	if d != m || d.DevNameString() != "/dev/ram0" || string(d.DevNameBytes()) != "/dev/ram0" {
		t.Fatalf("%+v", d)
	}
	long := strings.Repeat("d", 254)
	mustNoErr(t, m.SetDevName(long))
	m.MarshalTo(b)
	mustNoErr(t, d.Unmarshal(b))
	if d.DevNameString() != long {
		t.Fatal("long name")
	}
	wantErr(t, m.SetDevName(long+"d"), ErrOutOfRange)
	wantErr(t, m.SetDevName("a\x00"), ErrOutOfRange)

	wantErr(t, d.Unmarshal(want[:263]), ErrTruncated)
	x := bytes.Clone(want)
	x[0] = 3
	wantErr(t, d.Unmarshal(x), ErrBadType)
	x = bytes.Clone(want)
	x[4] = 3
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	x = bytes.Clone(want)
	for i := 6; i < 261; i++ {
		x[i] = 'x'
	}
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	x = bytes.Clone(want)
	x[5], x[100], x[262] = 9, 'z', 7 // resv1, after NUL, reserved: ignored
	mustNoErr(t, d.Unmarshal(x))
	if d.DevNameString() != "/dev/ram0" || d.DevName[100] != 0 {
		t.Fatal("ignored bytes leaked")
	}
	bad := Open{AccessMode: 3}
	_, err = bad.MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	bad = Open{}
	for i := range bad.DevName {
		bad.DevName[i] = 'q'
	}
	_, err = bad.MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	if len(bad.DevNameBytes()) != 255 {
		t.Fatal("unterminated DevNameBytes")
	}
	_, err = m.MarshalTo(b[:263])
	wantErr(t, err, ErrShortBuffer)
}

func openRspExample() OpenRsp {
	return OpenRsp{
		DeviceID: 1, NSectors: 2097152, MaxHWSectors: 2560, MaxWriteZeroesSectors: 0x3FFFFF,
		MaxDiscardSectors: 0x3FFFFF, DiscardGranularity: 4096, DiscardAlignment: 0,
		PhysicalBlockSize: 4096, LogicalBlockSize: 512, MaxSegments: 128, SecureDiscard: 0,
		CachePolicy: CacheFUA | CacheWriteback,
	}
}

func TestOpenRsp(t *testing.T) {
	m := openRspExample()
	want := hx(t, "03 00 00 00 01 00 00 00 00 00 20 00 00 00 00 00 00 0a 00 00 ff ff 3f 00 ff ff 3f 00"+
		"00 10 00 00 00 00 00 00 00 10 00 02 80 00 00 00 00 03 00 00 00 00 00 00 00 00 00 00")
	b := bytes.Repeat([]byte{0xEE}, 56)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 56 || !bytes.Equal(b, want) {
		t.Fatalf("\n got % x\nwant % x", b, want)
	}
	var d OpenRsp
	mustNoErr(t, d.Unmarshal(b))
	if d != m {
		t.Fatalf("%+v", d)
	}
	mustNoErr(t, d.Check())
	x := bytes.Clone(want)
	x[44], x[50] = 1, 1 // obsolete_rotational, reserved: ignored
	mustNoErr(t, d.Unmarshal(x))
	if d != m {
		t.Fatal("ignored bytes leaked")
	}
	x = bytes.Clone(want)
	x[38], x[39] = 0, 0
	mustNoErr(t, d.Unmarshal(x)) // decodes, so the client can CLOSE device 1
	wantErr(t, d.Check(), ErrOutOfRange)
	if d.DeviceID != 1 {
		t.Fatal(d.DeviceID)
	}
	wantErr(t, d.Unmarshal(want[:55]), ErrTruncated)
	x = bytes.Clone(want)
	x[0] = 2
	wantErr(t, d.Unmarshal(x), ErrBadType)
	_, err = m.MarshalTo(b[:55])
	wantErr(t, err, ErrShortBuffer)
}

func TestClose(t *testing.T) {
	b := make([]byte, 8)
	n, err := (&Close{DeviceID: 7}).MarshalTo(b)
	mustNoErr(t, err)
	if n != 8 || !bytes.Equal(b, hx(t, "05 00 00 00 07 00 00 00")) {
		t.Fatalf("% x", b)
	}
	var d Close
	mustNoErr(t, d.Unmarshal(b))
	if d.DeviceID != 7 {
		t.Fatal(d)
	}
	wantErr(t, d.Unmarshal(b[:7]), ErrTruncated)
	b[0] = 4
	wantErr(t, d.Unmarshal(b), ErrBadType)
	_, err = d.MarshalTo(b[:7])
	wantErr(t, err, ErrShortBuffer)
}

func TestMsgHdr(t *testing.T) {
	b := make([]byte, 4)
	for typ := MsgSessInfo; typ <= MsgClose; typ++ {
		n, err := (&MsgHdr{Type: typ}).MarshalTo(b)
		mustNoErr(t, err)
		if n != 4 || !bytes.Equal(b, []byte{byte(typ), 0, 0, 0}) {
			t.Fatalf("% x", b)
		}
		var h MsgHdr
		mustNoErr(t, h.Unmarshal(b))
		if h.Type != typ || !typ.Known() {
			t.Fatal(h)
		}
	}
	names := []string{"SESS_INFO", "SESS_INFO_RSP", "OPEN", "OPEN_RSP", "IO", "CLOSE"}
	for i, s := range names {
		if MsgType(i).String() != s {
			t.Errorf("%d: %s", i, MsgType(i))
		}
	}
	if MsgType(6).String() != "MsgType(6)" || MsgType(6).Known() {
		t.Error("type 6")
	}
	_, err := PeekType([]byte{6, 0, 0, 0})
	wantErr(t, err, ErrBadType)
	_, err = PeekType([]byte{4, 0, 0})
	wantErr(t, err, ErrTruncated)
	_, err = (&MsgHdr{Type: 9}).MarshalTo(b)
	wantErr(t, err, ErrBadType)
	_, err = (&MsgHdr{}).MarshalTo(b[:3])
	wantErr(t, err, ErrShortBuffer)
	var h MsgHdr
	wantErr(t, h.Unmarshal([]byte{0, 1, 0, 0}), ErrBadType)
}

// §11 end to end: a 4 KiB write and a read as the server sees them.
func TestIOInChunk(t *testing.T) {
	ic, err := rtrs.NewImmCodec(512, 128<<10)
	mustNoErr(t, err)
	chunk := make([]byte, 128<<10)
	var usr [IOSize]byte
	m := IO{DeviceID: 0, Sector: 8, RW: MakeRW(OpRead, FlagSync), BiSize: 4096}
	m.MarshalTo(usr[:])
	off, err := rtrs.PutReadReq(chunk, 4096, usr[:], rtrs.FlagNeedInval, []rtrs.SGDesc{{Addr: 0x1000, Key: 0x99, Len: 4096}})
	mustNoErr(t, err)
	imm, err := ic.IOReq(3, off)
	mustNoErr(t, err)
	if imm != 0x00181020 {
		t.Fatalf("imm %#x", imm)
	}
	d, err := ic.Decode(imm)
	mustNoErr(t, err)
	r, err := rtrs.ParseIOReq(chunk, d.Off)
	mustNoErr(t, err)
	typ, err := PeekType(r.Usr)
	mustNoErr(t, err)
	var got IO
	mustNoErr(t, got.Unmarshal(r.Usr))
	if typ != MsgIO || got != m || len(r.Data) != int(got.BiSize) {
		t.Fatalf("%v %+v %d", typ, got, len(r.Data))
	}
}

var (
	hx        = wiretest.Hex
	wantErr   = wiretest.WantErr
	mustNoErr = wiretest.NoErr
)
