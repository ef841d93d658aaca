package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// PathConfig describes one client path: where to connect and who we are.
type PathConfig struct {
	// Addr is the server's host:port.
	Addr string
	// LocalAddr, if set, is the source address to connect from.
	LocalAddr *net.TCPAddr
	// SessName is the session name sent in INFO_REQ (rtrs.CheckSessName).
	SessName string
	// PathsUUID identifies the session, SessUUID this path.
	PathsUUID, SessUUID rtrs.UUID
	// CIDNum is the number of connections (cid 0 + IO connections),
	// 1..rtrs.MaxConnsPerPath.
	CIDNum int
	// FirstConn lets the server create the session (see rtrs.ConnReq).
	FirstConn bool
	// Fence asks the server for fencing (rtrs.ConnReq.Fence); a server
	// that offers it answers rtrs.FlagFence in Params.Flags.
	Fence bool
	// ReconCnt is sent as recon_cnt.
	ReconCnt uint16
	// Timeout bounds the TCP connect and every handshake read and write;
	// default rtrs.ConnectTimeout.
	Timeout time.Duration
	// Key, if set, authenticates the path (DialPath) and requires the
	// server to prove the key too.
	Key *rtrs.Key
	// TLS, if set, runs each connection over TLS 1.3 (tls.go); without a
	// ServerName, Addr's host is verified.
	TLS *tls.Config
}

// Params are the session parameters a server announced in its ConnRsp.
type Params = rtrs.Params

// ClientConn is one established client connection of a path.
type ClientConn struct {
	cc  *ctrlConn
	cid uint16
}

// CID returns the connection's index in its path.
func (c *ClientConn) CID() uint16 { return c.cid }

// NetConn returns the underlying TCP connection.
func (c *ClientConn) NetConn() net.Conn { return c.cc.nc }

// Decoder returns the connection's frame decoder (direction ToClient,
// session parameters set).
func (c *ClientConn) Decoder() *frame.Decoder { return c.cc.dec }

// Close closes the connection.
func (c *ClientConn) Close() error { return c.cc.nc.Close() }

// Dial connects one connection of a path: TCP connect, ConnReq, ConnRsp.
// A refusal by the server is returned as a *RejectError.
func Dial(ctx context.Context, cfg *PathConfig, req *rtrs.ConnReq) (*ClientConn, Params, error) {
	return dial(ctx, cfg, req, nil)
}

// dial is Dial with the path's authentication.
func dial(ctx context.Context, cfg *PathConfig, req *rtrs.ConnReq, auth *rtrs.ClientAuth) (*ClientConn, Params, error) {
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = rtrs.ConnectTimeout
	}
	d := net.Dialer{Timeout: timeout}
	if cfg.LocalAddr != nil {
		d.LocalAddr = cfg.LocalAddr
	}
	nc, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, Params{}, fmt.Errorf("rtrs/tcp: connect cid %d: %w", req.CID, err)
	}
	if cfg.TLS != nil {
		tc := cfg.TLS
		if tc.ServerName == "" {
			tc = tc.Clone()
			tc.ServerName, _, _ = net.SplitHostPort(cfg.Addr)
		}
		if _, err := clientTLS(ctx, nc.(*net.TCPConn), tc, timeout); err != nil {
			_ = nc.Close()
			return nil, Params{}, fmt.Errorf("rtrs/tcp: cid %d: %w", req.CID, err)
		}
	}
	c := &ClientConn{cc: newCtrlConn(nc, frame.ToClient, timeout), cid: req.CID}
	p, err := c.connect(ctx, req, auth)
	if err != nil {
		_ = nc.Close()
		return nil, Params{}, err
	}
	return c, p, nil
}

func (c *ClientConn) connect(ctx context.Context, req *rtrs.ConnReq, auth *rtrs.ClientAuth) (Params, error) {
	// Close the socket if ctx ends while we wait.
	stop := context.AfterFunc(ctx, func() { _ = c.cc.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := c.cc.writeCtrl(frame.CtrlConnReq, req); err != nil {
		return Params{}, err
	}
	b, err := c.cc.readCtrl(frame.CtrlConnRsp)
	if err != nil {
		return Params{}, ctxErr(ctx, err)
	}
	var rsp rtrs.ConnRsp
	if err := rsp.Unmarshal(b); err != nil {
		return Params{}, fmt.Errorf("rtrs/tcp: cid %d: %w", req.CID, err)
	}
	if rsp.Errno != 0 {
		e := int(rsp.Errno)
		if e > 0 { // not a kernel-style negative errno: treat like a bad reply
			return Params{}, &RejectError{CID: req.CID, Errno: syscall.ECONNRESET}
		}
		if syscall.Errno(-e) == syscall.EPROTONOSUPPORT {
			// The one refusal a urnbd server sends before any check: TLS required.
			return Params{}, fmt.Errorf("%w (%w)", &RejectError{CID: req.CID, Errno: syscall.EPROTONOSUPPORT}, ErrTLSRequired)
		}
		return Params{}, &RejectError{CID: req.CID, Errno: syscall.Errno(-e)}
	}
	p, err := rsp.Params()
	if err != nil {
		return Params{}, fmt.Errorf("rtrs/tcp: cid %d: %w", req.CID, err)
	}
	if err := auth.CheckConnRsp(req, &rsp); err != nil {
		return Params{}, fmt.Errorf("rtrs/tcp: %v: %w", c.cc.nc.RemoteAddr(), err)
	}
	c.cc.dec.SetSession(p.Codec, nil)
	return p, nil
}

// ctxErr prefers the context's error when it ended the wait.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// ClientPath is an established client path: CIDNum connections and the
// session parameters of cid 0.
type ClientPath struct {
	Conns  []*ClientConn
	Params Params
	// Chunks are the server chunks from INFO_RSP (over TCP only their
	// number matters; addresses are offsets).
	Chunks []rtrs.RemoteChunk
}

// Close closes every connection of the path.
func (p *ClientPath) Close() error {
	var errs []error
	for _, c := range p.Conns {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DialPath establishes a path as the kernel client does: cids 0..CIDNum-1
// one after another, then INFO_REQ/INFO_RSP on cid 0. Every connection must
// announce the parameters of cid 0.
func DialPath(ctx context.Context, cfg PathConfig) (*ClientPath, error) {
	if err := rtrs.CheckSessName(cfg.SessName); err != nil {
		return nil, fmt.Errorf("rtrs/tcp: %w", err)
	}
	if cfg.CIDNum < 1 || cfg.CIDNum > rtrs.MaxConnsPerPath {
		return nil, fmt.Errorf("rtrs/tcp: cid_num %d not in 1..%d: %w", cfg.CIDNum, rtrs.MaxConnsPerPath, rtrs.ErrOutOfRange)
	}
	p := &ClientPath{}
	auth := rtrs.NewClientAuth(cfg.Key)
	fail := func(err error) (*ClientPath, error) {
		_ = p.Close()
		return nil, err
	}
	for cid := 0; cid < cfg.CIDNum; cid++ {
		req := rtrs.ConnReq{
			CID: uint16(cid), CIDNum: uint16(cfg.CIDNum), ReconCnt: cfg.ReconCnt,
			SessUUID: cfg.SessUUID, PathsUUID: cfg.PathsUUID, FirstConn: cfg.FirstConn, Fence: cfg.Fence,
		}
		auth.AddToConnReq(&req)
		c, params, err := dial(ctx, &cfg, &req, auth)
		if err != nil {
			if !errors.Is(err, ErrCertRefused) {
				err = rtrs.ExplainRefusal(err, cfg.Key)
			}
			return fail(err)
		}
		p.Conns = append(p.Conns, c)
		if cid == 0 {
			p.Params = params
		} else if params != p.Params {
			return fail(fmt.Errorf("rtrs/tcp: cid %d announced %+v, cid 0 %+v: %w", cid, params, p.Params, rtrs.ErrOutOfRange))
		}
	}
	if err := p.info(ctx, cfg.SessName, auth); err != nil {
		return fail(err)
	}
	return p, nil
}

// info runs INFO_REQ/INFO_RSP on cid 0 and checks the chunk descriptors.
func (p *ClientPath) info(ctx context.Context, name string, auth *rtrs.ClientAuth) error {
	cc := p.Conns[0].cc
	stop := context.AfterFunc(ctx, func() { _ = cc.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var req rtrs.InfoReq
	if err := req.SetName(name); err != nil {
		return fmt.Errorf("rtrs/tcp: %w", err)
	}
	auth.AddToInfoReq(&req)
	if err := cc.writeCtrl(frame.CtrlInfoReq, &req); err != nil {
		return ctxErr(ctx, err)
	}
	b, err := cc.readCtrl(frame.CtrlInfoRsp)
	if err != nil {
		return ctxErr(ctx, err)
	}
	var rsp rtrs.InfoRsp
	if err := rsp.Unmarshal(b); err != nil {
		return fmt.Errorf("rtrs/tcp: %w", err)
	}
	if err := auth.CheckInfoRsp(&rsp); err != nil {
		return fmt.Errorf("rtrs/tcp: %v: %w", cc.nc.RemoteAddr(), err)
	}
	chunks, err := rsp.ChunkBufs(p.Params.QueueDepth, uint32(p.Params.ChunkSize), nil)
	if err != nil {
		return fmt.Errorf("rtrs/tcp: %w", err)
	}
	p.Chunks = chunks
	return nil
}
