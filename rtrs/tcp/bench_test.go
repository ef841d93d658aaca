package tcp

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
)

// BenchmarkFrameEncodeDecode encodes a 4 KiB WRITE request frame (header
// and payload into a buffer, as a TCP sender would) and decodes it with
// Feed into a placed chunk, as a server would. 0 allocs/op.
func BenchmarkFrameEncodeDecode(b *testing.B) {
	c := testCodec(b)
	usr := make([]byte, 32)
	data := make([]byte, 4096)
	l, err := rtrs.WriteLayout(len(data), len(usr), testChunk, testHdr)
	mustNoErr(b, err)
	src := make([]byte, testChunk)
	_, err = rtrs.PutWriteReq(src, data, usr)
	mustNoErr(b, err)
	payload := src[:l.WriteLen]
	wire := make([]byte, HeaderSize+testChunk)
	var chunks [testQD][testChunk]byte
	d := NewDecoder(ToServer)
	d.SetSession(c, placerFunc(func(f *Frame) ([]byte, error) { return chunks[f.Imm.BufID][f.Off:], nil }))
	b.SetBytes(int64(HeaderSize + len(payload)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h, err := IOReqHeader(c, uint32(i%testQD), l)
		if err != nil {
			b.Fatal(err)
		}
		n, err := PutFrame(wire, h, payload)
		if err != nil {
			b.Fatal(err)
		}
		p := wire[:n]
		for len(p) > 0 {
			m, f, err := d.Feed(p)
			if err != nil {
				b.Fatal(err)
			}
			p = p[m:]
			if f != nil && f.Imm.Off != l.HdrOff {
				b.Fatal("bad frame")
			}
		}
	}
}

// BenchmarkHeaderEncodeDecode is the per-frame overhead alone: a heartbeat
// header encoded and decoded. 0 allocs/op.
func BenchmarkHeaderEncodeDecode(b *testing.B) {
	d := NewDecoder(ToClient)
	d.SetSession(testCodec(b), nil)
	var wire [HeaderSize]byte
	b.ReportAllocs()
	for b.Loop() {
		_, _ = HeartbeatHeader(true).MarshalTo(wire[:])
		_, f, err := d.Feed(wire[:])
		if err != nil || f == nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoopbackCeiling128K is the ceiling of a 128 KiB read over TCP
// on loopback, whatever the protocol: on one connection per CPU
// (RunParallel), a goroutine writes 128 KiB messages, taken in turn from
// a 1 GiB region as a sequential read of a 1 GiB memory device would, and
// another reads them, with nothing else done (the copy into the socket
// and the copy out of it). Its messages per second bound any TCP block
// transport's 128 KiB read IOPS on the same machine;
// tools/bench/rtrs-tcp.sh prints it beside the comparison with nbdkit.
func BenchmarkLoopbackCeiling128K(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNoErr(b, err)
	defer ln.Close()
	const size = 128 << 10
	var readers sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			readers.Add(1)
			go func() {
				defer readers.Done()
				defer c.Close()
				buf := make([]byte, size)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	region := make([]byte, 1<<30)
	for i := 0; i < len(region); i += 4096 {
		region[i] = 1 // fault the pages in before the clock runs
	}
	var next atomic.Int64
	b.SetBytes(size)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		for pb.Next() {
			off := next.Add(size) % int64(len(region))
			if _, err := c.Write(region[off : off+size]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	ln.Close()
	readers.Wait()
}
