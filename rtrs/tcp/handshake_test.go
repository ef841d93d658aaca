package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frametest"
)

func startServer(t *testing.T, cfg ServerConfig, listeners int) (*Server, []string) {
	t.Helper()
	if cfg.QueueDepth == 0 {
		cfg.QueueDepth, cfg.ChunkSize, cfg.MaxHdrSize = frametest.QD, frametest.Chunk, frametest.Hdr
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 2 * time.Second
	}
	srv, err := NewServer(cfg)
	mustNoErr(t, err)
	var addrs []string
	for range listeners {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		mustNoErr(t, err)
		addrs = append(addrs, ln.Addr().String())
		go func() { _ = srv.Serve(ln) }()
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, addrs
}

func uuid(b byte) rtrs.UUID {
	var u rtrs.UUID
	for i := range u {
		u[i] = b
	}
	return u
}

func pathCfg(addr string, sess, path byte, cidNum int, first bool) PathConfig {
	return PathConfig{Addr: addr, SessName: "sess" + string('a'+rune(sess)), PathsUUID: uuid(sess),
		SessUUID: uuid(path), CIDNum: cidNum, FirstConn: first, Timeout: 2 * time.Second}
}

// waitFor polls cond for up to 2 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestHandshakeOK(t *testing.T) {
	srv, addrs := startServer(t, ServerConfig{}, 2)
	ctx := context.Background()
	p, err := DialPath(ctx, pathCfg(addrs[0], 1, 10, 3, true))
	mustNoErr(t, err)
	defer p.Close()
	want := Params{QueueDepth: frametest.QD, MaxIOSize: frametest.Chunk - frametest.Hdr, MaxHdrSize: frametest.Hdr, ChunkSize: frametest.Chunk, Codec: frametest.Codec(t)}
	if p.Params != want {
		t.Fatalf("params %+v, want %+v", p.Params, want)
	}
	if len(p.Conns) != 3 || len(p.Chunks) != frametest.QD || p.Chunks[1].Addr != frametest.Chunk {
		t.Fatalf("path %d conns, chunks %+v", len(p.Conns), p.Chunks)
	}
	// A second path of the same session, to the second listener, without
	// first_conn: the session exists.
	p2, err := DialPath(ctx, pathCfg(addrs[1], 1, 11, 2, false))
	mustNoErr(t, err)
	defer p2.Close()

	ss := srv.SessionList()
	if len(ss) != 1 || ss[0].Name != "sessb" || ss[0].PathsUUID != uuid(1) || len(ss[0].Paths) != 2 {
		t.Fatalf("sessions %+v", ss)
	}
	for i, pi := range ss[0].Paths {
		if pi.State != rtrs.ServerPathConnected || pi.Conns != pi.CIDNum || pi.CIDNum != 3-i {
			t.Fatalf("path %d: %+v", i, pi)
		}
	}

	// Closing a path on the server closes its connections.
	srv.ClosePath(firstConn(t, srv, uuid(1), uuid(10)))
	var b [1]byte
	_ = p.Conns[2].NetConn().SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := p.Conns[2].NetConn().Read(b[:]); err != io.EOF {
		t.Fatalf("read after server closed the path: %v", err)
	}
	if ss := srv.SessionList(); len(ss) != 1 || len(ss[0].Paths) != 1 {
		t.Fatalf("after close: %+v", ss)
	}
}

// firstConn finds cid 0 of a path in the server's bookkeeping.
func firstConn(t *testing.T, srv *Server, sess, path rtrs.UUID) *ServerConn {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for p := range srv.paths {
		if p.core.Session().PathsUUID() == sess && p.core.SessUUID() == path {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.conns[0]
		}
	}
	t.Fatal("path not found")
	return nil
}

// rawConnReq sends payload as a CONN_REQ frame and returns the server's
// ConnRsp errno (negative) or an error.
func rawConnReq(t *testing.T, addr string, payload []byte) int16 {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	mustNoErr(t, err)
	defer nc.Close()
	h, err := frame.CtrlHeader(frame.CtrlConnReq, len(payload))
	mustNoErr(t, err)
	b := make([]byte, frame.HeaderSize+len(payload))
	_, err = frame.PutFrame(b, h, payload)
	mustNoErr(t, err)
	_, err = nc.Write(b)
	mustNoErr(t, err)
	_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	f, err := frame.NewDecoder(frame.ToClient).ReadFrame(nc)
	mustNoErr(t, err)
	var rsp rtrs.ConnRsp
	mustNoErr(t, rsp.Unmarshal(f.Payload))
	// Then the server closes.
	if _, err := nc.Read(b[:1]); err != io.EOF {
		t.Fatalf("connection not closed after refusal: %v", err)
	}
	return rsp.Errno
}

func TestHandshakeRejectMalformed(t *testing.T) {
	_, addrs := startServer(t, ServerConfig{}, 1)
	good := func() []byte {
		req := rtrs.ConnReq{CID: 0, CIDNum: 2, SessUUID: uuid(2), PathsUUID: uuid(3), FirstConn: true}
		b := make([]byte, rtrs.ConnReqSize)
		_, err := req.MarshalTo(b)
		mustNoErr(t, err)
		return b
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:rtrs.ConnReqSize-1] }},
		{"magic", func(b []byte) []byte { b[2] ^= 1; return b }},
		{"version", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[4:], 0x0300); return b }},
		{"cid_num", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[8:], rtrs.MaxConnsPerPath+1); return b }},
		{"cid", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 2); return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e := rawConnReq(t, addrs[0], tc.mod(good())); e != -int16(syscall.ECONNRESET) {
				t.Fatalf("errno %d, want -ECONNRESET", e)
			}
		})
	}
}

func TestHandshakeRejectSession(t *testing.T) {
	srv, addrs := startServer(t, ServerConfig{}, 2)
	ctx := context.Background()
	dial := func(cfg PathConfig, cid uint16) (*ClientConn, error) {
		req := rtrs.ConnReq{CID: cid, CIDNum: uint16(cfg.CIDNum), SessUUID: cfg.SessUUID,
			PathsUUID: cfg.PathsUUID, FirstConn: cfg.FirstConn}
		c, _, err := Dial(ctx, &cfg, &req)
		return c, err
	}
	wantReject := func(err error, errno syscall.Errno) {
		t.Helper()
		var re *RejectError
		if !errors.As(err, &re) || re.Errno != errno || !errors.Is(err, errno) {
			t.Fatalf("got %v, want a refusal with %v", err, errno)
		}
	}

	// Unknown session without first_conn.
	_, err := dial(pathCfg(addrs[0], 5, 50, 2, false), 0)
	wantReject(err, syscall.ENXIO)
	_, err = DialPath(ctx, pathCfg(addrs[0], 5, 50, 2, false))
	wantReject(err, syscall.ENXIO)

	// A path in CONNECTING: cid slot taken, cid_num differs.
	cfg := pathCfg(addrs[0], 6, 60, 2, true)
	c0, err := dial(cfg, 0)
	mustNoErr(t, err)
	defer c0.Close()
	_, err = dial(cfg, 0)
	wantReject(err, syscall.ECONNRESET)
	cfg3 := cfg
	cfg3.CIDNum = 3
	_, err = dial(cfg3, 1)
	wantReject(err, syscall.ECONNRESET)

	// Another path of session 6 from the same client IP to the same
	// server address: EEXIST. To the other listener it is fine.
	_, err = dial(pathCfg(addrs[0], 6, 61, 2, true), 0)
	wantReject(err, syscall.EEXIST)
	c1, err := dial(pathCfg(addrs[1], 6, 61, 2, true), 0)
	mustNoErr(t, err)
	defer c1.Close()

	// A connected path takes no more connections.
	p, err := DialPath(ctx, pathCfg(addrs[0], 7, 70, 1, true))
	mustNoErr(t, err)
	defer p.Close()
	_, err = dial(pathCfg(addrs[0], 7, 70, 1, true), 0)
	wantReject(err, syscall.ECONNRESET)

	// A second session with the name of session 7: the server closes the
	// path after INFO_REQ (EPERM on its side) and forgets the session.
	cfg = pathCfg(addrs[1], 8, 80, 1, true)
	cfg.SessName = "sessh" // session 7's name
	if _, err := DialPath(ctx, cfg); err == nil {
		t.Fatal("second session with the same name accepted")
	}
	waitFor(t, "session 8 removed", func() bool {
		for _, s := range srv.SessionList() {
			if s.PathsUUID == uuid(8) {
				return false
			}
		}
		return true
	})
}

// Garbage, truncated or wrong handshakes close the connection without a
// panic and without an answer.
func TestHandshakeGarbage(t *testing.T) {
	srv, addrs := startServer(t, ServerConfig{HandshakeTimeout: 300 * time.Millisecond}, 1)
	var hb [frame.HeaderSize]byte
	_, _ = frame.HeartbeatHeader(false).MarshalTo(hb[:])
	var info [frame.HeaderSize + rtrs.InfoReqSize]byte
	_, err := frame.PutCtrl(info[:], frame.CtrlInfoReq, &rtrs.InfoReq{})
	mustNoErr(t, err)
	var huge [frame.HeaderSize]byte
	_, _ = frame.Header{Imm: frame.CtrlConnReq.Imm(), Len: 1 << 30}.MarshalTo(huge[:])
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"nothing", nil},
		{"random", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"half header", hb[:5]},
		{"heartbeat first", hb[:]},
		{"info_req first", info[:]},
		{"huge ctrl", huge[:]},
		{"truncated conn_req", info[:frame.HeaderSize+10]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", addrs[0])
			mustNoErr(t, err)
			defer nc.Close()
			if len(tc.send) > 0 {
				_, err = nc.Write(tc.send)
				mustNoErr(t, err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, err := nc.Read(make([]byte, 64))
			if n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
				t.Fatalf("read %d bytes, %v; want the server to close", n, err)
			}
		})
	}
	if ss := srv.SessionList(); len(ss) != 0 {
		t.Fatalf("sessions after garbage: %+v", ss)
	}
}

// A client whose server never answers gets a timeout, not a hang.
func TestDialTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNoErr(t, err)
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err == nil {
			defer nc.Close()
			time.Sleep(2 * time.Second)
		}
	}()
	cfg := pathCfg(ln.Addr().String(), 1, 1, 1, true)
	cfg.Timeout = 200 * time.Millisecond
	start := time.Now()
	_, err = DialPath(context.Background(), cfg)
	if !errors.Is(err, syscall.ETIMEDOUT) && !isTimeout(err) {
		t.Fatalf("got %v, want a timeout", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
