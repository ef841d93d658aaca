package rtrs

import "testing"

var (
	sinkU32 uint32
	sinkImm Imm
	sinkReq IOReq
	sinkN   int
)

func BenchmarkImmEncodeIOReq(b *testing.B) {
	ic, _ := NewImmCodec(512, 128<<10)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		v, err := ic.IOReq(uint32(i)&511, 0x1020)
		if err != nil {
			b.Fatal(err)
		}
		sinkU32 = v
	}
}

func BenchmarkImmEncodeIORsp(b *testing.B) {
	ic, _ := NewImmCodec(512, 128<<10)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		v, err := ic.IORsp(uint32(i)&511, -5, i&1 == 0)
		if err != nil {
			b.Fatal(err)
		}
		sinkU32 = v
	}
}

func BenchmarkImmDecode(b *testing.B) {
	ic, _ := NewImmCodec(512, 128<<10)
	imms := []uint32{0x00181020, 0x10280005, 0x20000003, HeartbeatImm}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		d, err := ic.Decode(imms[i&3])
		if err != nil {
			b.Fatal(err)
		}
		sinkImm = d
	}
}

func BenchmarkParseIOReqRead(b *testing.B) {
	chunk := make([]byte, 128<<10)
	off, _ := PutReadReq(chunk, 4096, make([]byte, 32), FlagNeedInval, []SGDesc{{Addr: 1, Key: 2, Len: 4096}})
	b.ReportAllocs()
	for b.Loop() {
		r, err := ParseIOReq(chunk, off)
		if err != nil {
			b.Fatal(err)
		}
		sinkReq = r
	}
}

func BenchmarkParseIOReqWrite(b *testing.B) {
	chunk := make([]byte, 128<<10)
	off, _ := PutWriteReq(chunk, make([]byte, 4096), make([]byte, 32))
	b.ReportAllocs()
	for b.Loop() {
		r, err := ParseIOReq(chunk, off)
		if err != nil {
			b.Fatal(err)
		}
		sinkReq = r
	}
}

func BenchmarkRdmaReadMsgMarshal(b *testing.B) {
	m := RdmaReadMsg{UsrLen: 32, Flags: FlagNeedInval, Desc: []SGDesc{{Addr: 1, Key: 2, Len: 4096}}}
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		n, err := m.MarshalTo(buf)
		if err != nil {
			b.Fatal(err)
		}
		sinkN = n
	}
}

func BenchmarkRdmaReadMsgUnmarshal(b *testing.B) {
	m := RdmaReadMsg{UsrLen: 32, Flags: FlagNeedInval, Desc: []SGDesc{{Addr: 1, Key: 2, Len: 4096}}}
	buf := make([]byte, 64)
	m.MarshalTo(buf)
	var d RdmaReadMsg
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
	sinkN = len(d.Desc)
}

func BenchmarkRdmaWriteMsgRoundTrip(b *testing.B) {
	buf := make([]byte, 4)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m := RdmaWriteMsg{UsrLen: uint16(i)}
		m.MarshalTo(buf)
		if err := m.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkConnReqRoundTrip(b *testing.B) {
	m, _ := connReqExample()
	buf := make([]byte, ConnReqSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.MarshalTo(buf); err != nil {
			b.Fatal(err)
		}
		if err := m.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRkeyRspRoundTrip(b *testing.B) {
	m := RkeyRsp{BufID: 3, RKey: 7}
	buf := make([]byte, RkeyRspSize)
	b.ReportAllocs()
	for b.Loop() {
		m.MarshalTo(buf)
		if err := m.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}
