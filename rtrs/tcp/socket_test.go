package tcp

import (
	"bytes"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frametest"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNoErr(t, err)
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		nc, _ := ln.Accept()
		ch <- nc
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	mustNoErr(t, err)
	s := <-ch
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// Frames of both directions cross a real socket, written in pieces split at
// random points and read with random buffer sizes through Feed.
func TestSocketRoundTrip(t *testing.T) {
	c := frametest.Codec(t)
	rng := rand.New(rand.NewPCG(1, 2))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	var toServer, toClient []frametest.Frame
	for range 300 {
		id := uint32(rng.IntN(frametest.QD))
		switch rng.IntN(4) {
		case 0:
			toServer = append(toServer, frametest.WriteReq(t, c, id, randBytes(rng.IntN(frametest.Chunk-frametest.Hdr)), randBytes(rng.IntN(64))))
		case 1:
			toServer = append(toServer, frametest.ReadReq(t, c, id, 1+rng.IntN(frametest.Chunk-frametest.Hdr), randBytes(32)))
		case 2:
			toServer = append(toServer, frametest.Frame{H: frame.HeartbeatHeader(rng.IntN(2) == 0), P: nil})
		case 3:
			n := rng.IntN(frametest.Chunk + 1)
			h, err := frame.IORspHeader(c, id, 0, n)
			mustNoErr(t, err)
			toClient = append(toClient, frametest.Frame{H: h, P: randBytes(n)})
		}
	}
	cl, sv := tcpPair(t)
	check := func(name string, w, r *net.TCPConn, dir frame.Direction, frames []frametest.Frame) {
		t.Helper()
		var stream []byte
		for _, f := range frames {
			stream = append(stream, f.Bytes(t)...)
		}
		wrng := rand.New(rand.NewPCG(3, uint64(dir)))
		go func() {
			_ = w.SetNoDelay(true)
			s := stream
			for len(s) > 0 {
				k := min(1+wrng.IntN(3*frame.HeaderSize), len(s))
				if wrng.IntN(8) == 0 {
					k = min(1+wrng.IntN(3*frametest.Chunk), len(s))
				}
				if _, err := w.Write(s[:k]); err != nil {
					return
				}
				s = s[k:]
			}
			_ = w.CloseWrite()
		}()
		d := frame.NewDecoder(dir)
		d.SetSession(c, nil)
		_ = r.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 2*frametest.Chunk)
		var got []frametest.Frame
		for {
			n, err := r.Read(buf[:1+rng.IntN(len(buf))])
			p := buf[:n]
			for len(p) > 0 {
				m, f, ferr := d.Feed(p)
				mustNoErr(t, ferr)
				p = p[m:]
				if f != nil {
					got = append(got, frametest.Frame{H: f.Header, P: bytes.Clone(f.Payload)})
				}
			}
			if err != nil {
				mustNoErr(t, d.End())
				break
			}
		}
		if len(got) != len(frames) {
			t.Fatalf("%s: %d frames, want %d", name, len(got), len(frames))
		}
		for i := range got {
			if got[i].H != frames[i].H || !bytes.Equal(got[i].P, frames[i].P) {
				t.Fatalf("%s: frame %d differs: %+v, want %+v", name, i, got[i].H, frames[i].H)
			}
			if got[i].H.Imm>>rtrs.ImmPayloadBits == uint32(rtrs.ImmIOReq) {
				im, _ := c.Decode(got[i].H.Imm)
				chunk := make([]byte, frametest.Chunk)
				copy(chunk[got[i].H.Off:], got[i].P)
				if _, err := rtrs.ParseIOReq(chunk, im.Off); err != nil {
					t.Fatalf("%s: frame %d: %v", name, i, err)
				}
			}
		}
	}
	check("client to server", cl, sv, frame.ToServer, toServer)
	check("server to client", sv, cl, frame.ToClient, toClient)
}
