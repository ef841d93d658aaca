package tcp

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// ServerConfig holds the parameters a server advertises in its ConnRsp.
type ServerConfig struct {
	// QueueDepth is the number of chunks of every session
	// (sess_queue_depth); default rtrs.DefaultSessQueueDepth.
	QueueDepth int
	// ChunkSize is max_chunk_size, a power of two >= rtrs.MinChunkSize;
	// default rtrs.DefaultMaxChunkSize.
	ChunkSize int
	// MaxHdrSize is the room for user message + RTRS header in a chunk;
	// default rtrs.DefaultMaxHdrSize. max_io_size = ChunkSize - MaxHdrSize.
	MaxHdrSize int
	// HandshakeTimeout bounds every read and write of the handshake;
	// default rtrs.ConnectTimeout.
	HandshakeTimeout time.Duration
	// Handler serves the IO requests; nil accepts connections but serves
	// nothing (handshake only).
	Handler ServerHandler
	// HeartbeatInterval and MissedHeartbeats: a path whose service
	// connection (cid 0) is silent for Interval × Missed is closed; defaults
	// rtrs.HBInterval and rtrs.HBMissedMax.
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
}

// Server accepts RTRS connections over TCP, groups them into sessions (by
// paths_uuid) and paths (by sess_uuid), and serves their IO requests with
// the configured Handler, one goroutine per connection.
type Server struct {
	cfg   ServerConfig
	codec rtrs.ImmCodec

	mu     sync.Mutex
	sess   sessions
	lns    map[net.Listener]struct{}
	hs     map[net.Conn]struct{} // connections in their handshake
	closed bool
	wg     sync.WaitGroup
}

// NewServer checks cfg (as the kernel checks its module parameters) and
// returns a server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.QueueDepth == 0 {
		cfg.QueueDepth = rtrs.DefaultSessQueueDepth
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = rtrs.HBInterval
	}
	if cfg.MissedHeartbeats == 0 {
		cfg.MissedHeartbeats = rtrs.HBMissedMax
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = rtrs.DefaultMaxChunkSize
	}
	if cfg.MaxHdrSize == 0 {
		cfg.MaxHdrSize = rtrs.DefaultMaxHdrSize
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = rtrs.ConnectTimeout
	}
	if err := rtrs.CheckServerParams(cfg.QueueDepth, cfg.ChunkSize); err != nil {
		return nil, fmt.Errorf("rtrs/tcp server: %w", err)
	}
	if cfg.MaxHdrSize <= 0 || cfg.MaxHdrSize >= cfg.ChunkSize {
		return nil, fmt.Errorf("rtrs/tcp server: max_hdr_size %d not in 1..%d: %w", cfg.MaxHdrSize, cfg.ChunkSize-1, rtrs.ErrOutOfRange)
	}
	codec, err := rtrs.NewImmCodec(cfg.QueueDepth, cfg.ChunkSize)
	if err != nil {
		return nil, fmt.Errorf("rtrs/tcp server: %w", err)
	}
	return &Server{
		cfg:   cfg,
		codec: codec,
		sess:  sessions{byUUID: make(map[rtrs.UUID]*ServerSession)},
		lns:   make(map[net.Listener]struct{}),
		hs:    make(map[net.Conn]struct{}),
	}, nil
}

// Config returns the server's configuration with defaults filled in.
func (s *Server) Config() ServerConfig { return s.cfg }

// Serve accepts connections on ln and runs the handshake of each in its own
// goroutine, until ln fails or the server is closed; it then returns the
// accept error (net.ErrClosed after Close).
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
	for {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
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
// ConnReq, the checks of RTRS-RNBD-WIRE.md §2.4, ConnRsp, and for cid 0
// InfoReq/InfoRsp. On success the connection is part of its path. On
// failure the connection is closed (and for a failure after the ConnRsp its
// whole path, as the kernel does) and the error says why; a refusal sent to
// the client wraps the errno sent (errors.Is(err, syscall.ENXIO)).
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
	cc := newCtrlConn(nc, ToServer, s.cfg.HandshakeTimeout)
	b, err := cc.readCtrl(CtrlConnReq)
	if err != nil {
		return nil, err // not even a conn request frame: just close
	}
	var req rtrs.ConnReq
	if err := req.Unmarshal(b); err != nil {
		return nil, s.reject(cc, syscall.ECONNRESET, err)
	}
	c := &ServerConn{nc: nc, cid: req.CID}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, s.reject(cc, syscall.ECONNRESET, net.ErrClosed)
	}
	errno := s.sess.attach(&req, c)
	s.mu.Unlock()
	if errno != 0 {
		return nil, s.reject(cc, errno, errors.New("session/path checks"))
	}
	rsp := rtrs.ConnRsp{
		QueueDepth: uint16(s.cfg.QueueDepth),
		MaxIOSize:  uint32(s.cfg.ChunkSize - s.cfg.MaxHdrSize),
		MaxHdrSize: uint32(s.cfg.MaxHdrSize),
	}
	if err := cc.writeCtrl(CtrlConnRsp, &rsp); err != nil {
		s.closePath(c.path)
		return nil, err
	}
	if req.CID == 0 {
		if err := s.info(cc, c.path); err != nil {
			s.closePath(c.path)
			return nil, err
		}
	}
	return c, nil
}

// info handles INFO_REQ on cid 0 and answers INFO_RSP.
func (s *Server) info(cc *ctrlConn, p *ServerPath) error {
	b, err := cc.readCtrl(CtrlInfoReq)
	if err != nil {
		return err
	}
	var req rtrs.InfoReq
	if err := req.Unmarshal(b); err != nil {
		return err
	}
	name := req.NameString()
	if err := rtrs.CheckSessName(name); err != nil {
		return err
	}
	s.mu.Lock()
	errno := syscall.ECONNRESET // path closed meanwhile
	if p.state == PathConnecting {
		errno = s.sess.setName(p, name)
	}
	s.mu.Unlock()
	if errno != 0 {
		return fmt.Errorf("session name %q: %w", name, errno)
	}
	rsp := rtrs.InfoRsp{Desc: []rtrs.SGDesc{{Len: uint32(s.cfg.QueueDepth * s.cfg.ChunkSize)}}}
	return cc.writeCtrl(CtrlInfoRsp, &rsp)
}

// reject answers a refused ConnReq with a ConnRsp carrying -errno and
// returns an error wrapping errno and cause.
func (s *Server) reject(cc *ctrlConn, errno syscall.Errno, cause error) error {
	rsp := rtrs.ConnRsp{Errno: -int16(errno)}
	if err := cc.writeCtrl(CtrlConnRsp, &rsp); err != nil {
		return fmt.Errorf("refused with %v (%v), sending the refusal failed: %w", errno, cause, err)
	}
	return fmt.Errorf("refused with -%d (%w): %w", int(errno), errno, cause)
}

// ClosePath closes every connection of the path c belongs to and removes
// the path (and its session, if it was the last path).
func (s *Server) ClosePath(c *ServerConn) {
	s.mu.Lock()
	p := c.path
	s.mu.Unlock()
	if p != nil {
		s.closePath(p)
	}
}

func (s *Server) closePath(p *ServerPath) {
	s.mu.Lock()
	conns := s.sess.remove(p)
	s.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			_ = c.nc.Close()
		}
	}
}

// Sessions returns a snapshot of the server's sessions and paths.
func (s *Server) Sessions() []SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess.snapshot()
}

// Close stops all Serve loops, closes every path and waits for running
// handshakes to end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	for nc := range s.hs {
		_ = nc.Close()
	}
	var paths []*ServerPath
	for _, sess := range s.sess.byUUID {
		paths = append(paths, sess.paths...)
	}
	s.mu.Unlock()
	for _, p := range paths {
		s.closePath(p)
	}
	s.wg.Wait()
	return nil
}
