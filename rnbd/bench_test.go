package rnbd

import "testing"

var sinkIO IO

func BenchmarkIOMarshal(b *testing.B) {
	m := IO{DeviceID: 7, Sector: 0x1000, RW: MakeRW(OpWrite, FlagSync), BiSize: 4096}
	buf := make([]byte, IOSize)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.Sector = uint64(i)
		if _, err := m.MarshalTo(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIOUnmarshal(b *testing.B) {
	m := IO{DeviceID: 7, Sector: 0x1000, RW: MakeRW(OpRead, FlagSync), BiSize: 4096}
	buf := make([]byte, IOSize)
	m.MarshalTo(buf)
	b.ReportAllocs()
	for b.Loop() {
		if err := sinkIO.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPeekType(b *testing.B) {
	buf := []byte{4, 0, 0, 0}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := PeekType(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenRoundTrip(b *testing.B) {
	var m Open
	m.SetDevName("/dev/ram0")
	buf := make([]byte, OpenSize)
	b.ReportAllocs()
	for b.Loop() {
		m.MarshalTo(buf)
		if err := m.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenRspRoundTrip(b *testing.B) {
	m := openRspExample()
	buf := make([]byte, OpenRspSize)
	b.ReportAllocs()
	for b.Loop() {
		m.MarshalTo(buf)
		if err := m.Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}
