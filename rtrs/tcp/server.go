package tcp

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// ServerConfig holds the parameters a server advertises in its ConnRsp.
type ServerConfig struct {
	rtrs.ServerConfig
	// HandshakeTimeout bounds every read and write of the handshake;
	// default rtrs.ConnectTimeout.
	HandshakeTimeout time.Duration
	// Handler serves the IO requests; nil accepts connections but serves
	// nothing (handshake only).
	Handler ServerHandler
	// TLS, if set, is required on every connection (tls.go): its
	// certificate, and with ClientAuth and ClientCAs the clients'. Its
	// GetConfigForClient may hand out a newer configuration (a reload).
	// A client certificate's name (CertName) is the path's identity.
	TLS *tls.Config
}

// Server accepts RTRS connections over TCP, groups them into sessions (by
// paths_uuid) and paths (by sess_uuid) through its rtrs.ServerTable, and
// serves their IO requests with the configured Handler, one goroutine per
// connection.
type Server struct {
	cfg   ServerConfig
	codec rtrs.ImmCodec
	tab   *rtrs.ServerTable
	owned bool // tab is the server's own

	mu     sync.Mutex
	paths  map[*serverPath]struct{}
	sios   map[*rtrs.ServerSession]*sessionIO
	lns    map[net.Listener]struct{}
	hs     map[net.Conn]struct{} // connections in their handshake
	closed bool
	wg     sync.WaitGroup
}

// NewServer checks cfg (as the kernel checks its module parameters) and
// returns a server.
func NewServer(cfg ServerConfig) (*Server, error) {
	var err error
	if cfg.ServerConfig, err = cfg.ServerConfig.Checked(); err != nil {
		return nil, fmt.Errorf("rtrs/tcp server: %w", err)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = rtrs.ConnectTimeout
	}
	codec, err := rtrs.NewImmCodec(cfg.QueueDepth, cfg.ChunkSize)
	if err != nil {
		return nil, fmt.Errorf("rtrs/tcp server: %w", err)
	}
	s := &Server{
		cfg:   cfg,
		codec: codec,
		tab:   cfg.Sessions,
		paths: make(map[*serverPath]struct{}),
		sios:  make(map[*rtrs.ServerSession]*sessionIO),
		lns:   make(map[net.Listener]struct{}),
		hs:    make(map[net.Conn]struct{}),
	}
	if s.tab == nil {
		s.tab = rtrs.NewServerTable(rtrs.ServerTableConfig{Logf: cfg.Logf})
		s.owned = true
	}
	return s, nil
}

// Config returns the server's configuration with defaults filled in.
func (s *Server) Config() ServerConfig { return s.cfg }

// Sessions returns the server's session layer.
func (s *Server) Sessions() *rtrs.ServerTable { return s.tab }

func (s *Server) logf(format string, args ...any) { s.cfg.Logf("rtrs/tcp server: "+format, args...) }

// Accept backoff: a failing Accept (out of file descriptors, for one) is
// retried after a pause that doubles up to acceptBackoffMax.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// Serve accepts connections on ln and runs the handshake of each in its own
// goroutine, until ln is closed or the server is; it then returns
// net.ErrClosed. Other accept errors (EMFILE, ENFILE, ECONNABORTED ...)
// are logged and retried with backoff: nothing a peer does ends Serve.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return net.ErrClosed
			}
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			s.logf("accept on %v: %v; retrying in %v", ln.Addr(), err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nc.Close()
			return net.ErrClosed
		}
		s.wg.Add(1) // under mu: never concurrent with Close's Wait
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c, err := s.Handshake(nc)
			if err == nil && s.cfg.Handler != nil {
				s.serveIO(c)
			}
		}()
	}
}

// Handshake runs the server side of the handshake on a new connection:
// admission (rtrs.ServerTable.Admit), ConnReq, the session and path checks,
// ConnRsp, and for cid 0 InfoReq/InfoRsp. On success the connection is part
// of its path. On failure the connection is closed (and for a failure after
// the ConnRsp its whole path, as the kernel does) and the error says why; a
// refusal sent to the client wraps the errno sent (errors.Is(err,
// syscall.ENXIO)).
func (s *Server) Handshake(nc net.Conn) (*ServerConn, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = nc.Close()
		return nil, fmt.Errorf("rtrs/tcp server: handshake with %v: %w", nc.RemoteAddr(), net.ErrClosed)
	}
	s.hs[nc] = struct{}{}
	s.mu.Unlock()
	c, err := s.handshake(nc)
	s.mu.Lock()
	delete(s.hs, nc)
	s.mu.Unlock()
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("rtrs/tcp server: handshake with %v: %w", nc.RemoteAddr(), err)
	}
	return c, nil
}

func (s *Server) handshake(nc net.Conn) (*ServerConn, error) {
	cc := newCtrlConn(nc, frame.ToServer, s.cfg.HandshakeTimeout)
	src, dst := addrPort(nc.RemoteAddr()), addrPort(nc.LocalAddr())
	slot, err := s.tab.Admit(src.Addr())
	if err != nil {
		// The client waits for a ConnRsp after its ConnReq: answer it at
		// once, and read what came only briefly (closing with unread data
		// would reset the connection before the answer is read).
		err = s.reject(cc, rtrs.ErrnoOr(err, syscall.EBUSY), err)
		_ = nc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var drain [frame.HeaderSize + rtrs.ConnReqSize]byte
		_, _ = nc.Read(drain[:])
		return nil, err
	}
	ctrl, cs, tlsErr := s.startConn(nc)
	if ctrl == nil {
		slot.Close()
		return nil, tlsErr
	}
	cc.nc = ctrl
	b, err := cc.readCtrl(frame.CtrlConnReq)
	if err != nil {
		slot.Close()
		return nil, err // not even a conn request frame: just close
	}
	if tlsErr != nil { // plaintext, and TLS required
		slot.Close()
		s.logf("%v: refused: a plaintext client, and this server requires TLS", src)
		return nil, s.reject(cc, syscall.EPROTONOSUPPORT, tlsErr)
	}
	var req rtrs.ConnReq
	if err := req.Unmarshal(b); err != nil {
		slot.Close()
		return nil, s.reject(cc, syscall.ECONNRESET, err)
	}
	c := &ServerConn{nc: nc, cid: req.CID, slot: slot}
	core, err := s.tab.AttachCert(&req, src, dst, CertName(cs), s.cfg.QueueDepth*s.cfg.ChunkSize, func(p *rtrs.ServerPath) rtrs.PathOwner {
		return &serverPath{s: s, core: p, conns: make([]*ServerConn, p.CIDNum())}
	})
	if err != nil {
		slot.Close()
		return nil, s.reject(cc, rtrs.ErrnoOr(err, syscall.ECONNRESET), err)
	}
	p := core.Owner().(*serverPath)
	c.path = p
	s.mu.Lock()
	if !s.closed && p.sio == nil {
		s.paths[p] = struct{}{}
		p.sio = s.sessionIO(core.Session())
	}
	closed := s.closed
	s.mu.Unlock()
	if closed || !p.add(c) {
		slot.Close()
		s.closePath(p)
		return nil, s.reject(cc, syscall.ECONNRESET, errors.New("path closed meanwhile"))
	}
	rsp := rtrs.ConnRsp{
		QueueDepth: uint16(s.cfg.QueueDepth),
		MaxIOSize:  uint32(s.cfg.ChunkSize - s.cfg.MaxHdrSize),
		MaxHdrSize: uint32(s.cfg.MaxHdrSize),
	}
	if req.Fence {
		rsp.Flags |= rtrs.FlagFence
	}
	core.AddAuth(&rsp, req.CID)
	if err := cc.writeCtrl(frame.CtrlConnRsp, &rsp); err != nil {
		s.closePath(p)
		return nil, err
	}
	if req.CID == 0 {
		if err := s.info(cc, p); err != nil {
			s.closePath(p)
			return nil, err
		}
	}
	slot.HandshakeDone()
	return c, nil
}

// startConn reads a new connection's first byte: a TLS handshake record
// starts TLS (required when the server has TLS: the returned error is
// then ErrTLSRequired, with the connection to read the ConnReq from); the
// returned connection is the one to read control frames from, nil when
// nc is to be closed.
func (s *Server) startConn(nc net.Conn) (net.Conn, *tls.ConnectionState, error) {
	_ = nc.SetReadDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	var b [1]byte
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		return nil, nil, fmt.Errorf("first byte: %w", err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	if b[0] != tlsRecordHandshake {
		pc := &prefixConn{Conn: nc, b: b, has: true}
		if s.cfg.TLS != nil {
			return pc, nil, ErrTLSRequired
		}
		return pc, nil, nil
	}
	if s.cfg.TLS == nil {
		s.logf("%v: closed: a TLS client, and this server has no TLS certificate", nc.RemoteAddr())
		return nil, nil, fmt.Errorf("a TLS client, and no TLS here: %w", syscall.EPROTONOSUPPORT)
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil, nil, fmt.Errorf("TLS on %T: kTLS needs a TCP connection: %w", nc, syscall.EPROTONOSUPPORT)
	}
	cs, err := serverTLS(tc, b[0], s.cfg.TLS, s.cfg.HandshakeTimeout)
	if err != nil {
		s.logf("%v: TLS refused: %v", nc.RemoteAddr(), err)
		return nil, nil, err
	}
	return nc, &cs, nil
}

// info handles INFO_REQ on cid 0 and answers INFO_RSP.
func (s *Server) info(cc *ctrlConn, p *serverPath) error {
	b, err := cc.readCtrl(frame.CtrlInfoReq)
	if err != nil {
		return err
	}
	var req rtrs.InfoReq
	if err := req.Unmarshal(b); err != nil {
		return err
	}
	name := req.NameString()
	if err := s.tab.Establish(p.core, &req); err != nil {
		s.logf("path %v → %v: session %q refused: %v", p.core.Src(), p.core.Dst(), name, err)
		return fmt.Errorf("session %q: %w", name, err)
	}
	rsp := rtrs.InfoRsp{Desc: []rtrs.SGDesc{{Len: uint32(s.cfg.QueueDepth * s.cfg.ChunkSize)}}}
	p.core.AddProof(&rsp)
	return cc.writeCtrl(frame.CtrlInfoRsp, &rsp)
}

// reject answers a refused ConnReq with a ConnRsp carrying -errno and
// returns an error wrapping errno and cause.
func (s *Server) reject(cc *ctrlConn, errno syscall.Errno, cause error) error {
	rsp := rtrs.ConnRsp{Errno: -int16(errno)}
	if err := cc.writeCtrl(frame.CtrlConnRsp, &rsp); err != nil {
		return fmt.Errorf("refused with %v (%v), sending the refusal failed: %w", errno, cause, err)
	}
	return fmt.Errorf("refused with -%d (%w): %w", int(errno), errno, cause)
}

// ClosePath closes every connection of the path c belongs to and removes
// the path (and its session, if it was the last path, after the session
// layer's linger time).
func (s *Server) ClosePath(c *ServerConn) {
	if c.path != nil {
		s.closePath(c.path)
	}
}

// closePath closes p: first in the session layer, so that no request of
// p starts any more, then its connections.
func (s *Server) closePath(p *serverPath) {
	s.tab.ClosePath(p.core)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.conns
	p.conns = make([]*ServerConn, len(conns))
	p.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			_ = c.nc.Close()
			c.slot.Close()
		}
	}
	s.mu.Lock()
	delete(s.paths, p)
	s.mu.Unlock()
}

// SessionList returns a snapshot of the server's sessions and paths.
func (s *Server) SessionList() []SessionInfo {
	s.mu.Lock()
	bySess := map[*rtrs.ServerSession][]*serverPath{}
	for p := range s.paths {
		bySess[p.core.Session()] = append(bySess[p.core.Session()], p)
	}
	s.mu.Unlock()
	out := make([]SessionInfo, 0, len(bySess))
	for sess, paths := range bySess {
		si := SessionInfo{Name: sess.Name(), PathsUUID: sess.PathsUUID()}
		for _, p := range paths {
			if p.core.State() != rtrs.ServerPathClosed {
				si.Paths = append(si.Paths, p.info())
			}
		}
		if len(si.Paths) > 0 {
			slices.SortFunc(si.Paths, func(a, b PathInfo) int { return bytes.Compare(a.SessUUID[:], b.SessUUID[:]) })
			out = append(out, si)
		}
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Close stops all Serve loops, closes every path and waits for running
// handshakes and connections to end (and, with a table of its own, for
// the sessions' release).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	for nc := range s.hs {
		_ = nc.Close()
	}
	paths := make([]*serverPath, 0, len(s.paths))
	for p := range s.paths {
		paths = append(paths, p)
	}
	s.mu.Unlock()
	if s.owned {
		s.tab.Close()
	}
	for _, p := range paths {
		s.closePath(p)
	}
	s.wg.Wait()
	if s.owned {
		s.tab.Wait()
	}
	return nil
}
