package tcp

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

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
