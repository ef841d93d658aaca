package rnbd

import (
	"os"
	"path/filepath"
	"testing"
)

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

// chanCompleter hands the errno of a completed request to the benchmark.
type chanCompleter chan int

func (c chanCompleter) Complete(errno int) { c <- errno }

// BenchmarkServerReadFile4K is the server's side of a 4 KiB read of a
// file export, through the io_uring engine to the completion: it must not
// allocate.
func BenchmarkServerReadFile4K(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "disk.img"), make([]byte, 1<<20), 0o600); err != nil {
		b.Fatal(err)
	}
	s, err := NewServer(ServerConfig{DevSearchPath: dir, MaxIOSize: 126976, AsyncIO: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if s.engine == nil {
		b.Skip("no io_uring")
	}
	open := Open{AccessMode: AccessRW}
	open.SetDevName("disk.img")
	usr := make([]byte, OpenSize)
	open.MarshalTo(usr)
	rsp := make([]byte, OpenRspSize)
	if e := s.handle(&request{Session: "bench", Usr: usr, Data: rsp}); e != 0 {
		b.Fatalf("open: errno %d", e)
	}
	msg := IO{DeviceID: 0, Sector: 8, RW: MakeRW(OpRead, FlagSync), BiSize: 4096}
	ioUsr := make([]byte, IOSize)
	msg.MarshalTo(ioUsr)
	done := make(chanCompleter, 1)
	r := request{Session: "bench", Usr: ioUsr, Data: make([]byte, 4096), io: done}
	b.ReportAllocs()
	for b.Loop() {
		if e := s.handleIO(&r); e != pending {
			b.Fatalf("read: %d, want pending", e)
		}
		if e := <-done; e != 0 {
			b.Fatalf("read: errno %d", e)
		}
	}
}
