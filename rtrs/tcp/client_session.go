package tcp

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/clientq"
	"github.com/urnbd/urnbd/rtrs/internal/session"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// ClientConfig describes a client session (rtrs.ClientConfig): over TCP
// a path's Dst is the server's "host:port" and Src, if set, the local IP
// to connect from.
type ClientConfig = rtrs.ClientConfig

// PathAddr is one path: Dst is the server's "host:port", Src optionally
// the local IP to connect from.
type PathAddr = rtrs.PathAddr

// ClientPathInfo is a snapshot of a client path.
type ClientPathInfo = rtrs.ClientPathInfo

type sessionAPI = session.API

// Client is an RTRS client session over TCP: its paths, each with one IO
// connection per queue, and the queues that carry requests. Its path
// methods (AddPath, RemovePath, DisconnectPath, ReconnectPath, Paths,
// SetPolicy, SetMaxReconnectAttempts, ResumeIO, Params) are the session
// layer's, the same on every transport.
type Client struct {
	sessionAPI
	s          *session.Session
	params     Params            // the session's, fixed by the first connect (start)
	renewAfter int64             // ClientConfig.RenewAfter
	queueSet   *clientq.QueueSet // permits, shared by the queues
	queues     []*ClientQueue
}

// transport is the Client as the session layer sees it.
type transport Client

// DialClient opens a session: it connects every path (at least one must
// connect; the others keep trying in the background, as the kernel client
// does) and returns the client with its queues, which the caller runs
// (ClientQueue.Run).
func DialClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	cfg, err := cfg.Checked()
	if err != nil {
		return nil, fmt.Errorf("rtrs/tcp client: %w", err)
	}
	c := &Client{}
	if c.s, err = session.New(cfg, (*transport)(c)); err != nil {
		return nil, fmt.Errorf("rtrs/tcp client: %w", err)
	}
	c.sessionAPI = c.s.API()
	if err := c.s.Dial(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("rtrs/tcp client: %w", err)
	}
	return c, nil
}

// Queue returns queue i (0..Queues-1, and the admin queue after them).
func (c *Client) Queue(i int) *ClientQueue { return c.queues[i] }

// Queues returns the number of per-CPU queues (the admin queue excluded).
func (c *Client) Queues() int { return c.s.Config().Queues }

// Admin returns the admin queue, or nil without ClientConfig.AdminQueue.
func (c *Client) Admin() *ClientQueue {
	if !c.s.Config().AdminQueue {
		return nil
	}
	return c.queues[c.s.Config().Queues]
}

// Permits returns the session's permit pool (its in-use count is the
// session's requests in flight).
func (c *Client) Permits() *rtrs.Permits { return c.queueSet.Permits() }

// Close ends the session: every path is closed, requests still waiting
// fail with -ENOTCONN, and the queues' Run loops return.
func (c *Client) Close() error {
	if !c.s.Close() {
		return nil
	}
	for _, q := range c.queues {
		q.core.PostClose()
	}
	// Queues that no loop drives will not read the message: close their
	// sockets here. A queue driven now closes them when its loop stops
	// (Detach).
	for _, q := range c.queues {
		q.closeUndriven()
	}
	return nil
}

// CheckPath implements session.Transport.
func (t *transport) CheckPath(a PathAddr) error {
	if a.Src != "" && net.ParseIP(a.Src) == nil {
		return fmt.Errorf("source address %q is not an IP address: %w", a.Src, syscall.EINVAL)
	}
	return nil
}

// Start implements session.Transport: the queues, sized by the first
// connect's parameters.
func (t *transport) Start(params Params) error {
	c := (*Client)(t)
	cfg := c.s.Config()
	c.params = params
	c.renewAfter = cfg.RenewAfter()
	c.queueSet = clientq.NewQueueSet(rtrs.NewPermits(params.QueueDepth))
	for i := 0; i < cfg.NumQueues(); i++ {
		q, err := newClientQueue(c, i)
		if err != nil {
			for _, q := range c.queues {
				q.core.CloseMailbox(nil)
			}
			c.queues = nil
			return err
		}
		c.queues = append(c.queues, q)
	}
	if cfg.AdminQueue {
		c.queues[cfg.Queues].core.SetAdmin()
	}
	return nil
}

// WakeQueues implements session.Transport.
func (t *transport) WakeQueues() {
	for _, q := range t.queues {
		q.core.PostRetry()
	}
}

// Fenced implements session.Transport.
func (t *transport) Fenced(p *session.Path, gen uint64) {
	for _, q := range t.queues {
		q.core.PostFenced(p, gen)
	}
}

// SetPolicy implements session.Transport.
func (t *transport) SetPolicy(pol rtrs.MPPolicy) {
	for _, q := range t.queues {
		q.core.PostPolicy(pol)
	}
}

// Connect implements session.Transport: cid 0..CIDNum-1 one after
// another, then INFO_REQ/INFO_RSP on cid 0 (DialPath).
func (t *transport) Connect(ctx context.Context, p *session.Path) (session.Conn, error) {
	cfg := t.s.Config()
	req := p.ConnReq(0)
	pc := PathConfig{
		Addr: p.Addr().Dst, SessName: cfg.SessName, PathsUUID: req.PathsUUID, SessUUID: req.SessUUID,
		CIDNum: int(req.CIDNum), FirstConn: req.FirstConn, ReconCnt: req.ReconCnt, Timeout: cfg.Timeout,
		Fence: req.Fence, Key: cfg.Key, TLS: cfg.TLS,
	}
	if src := p.Addr().Src; src != "" {
		pc.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)} // CheckPath made sure it parses
	}
	cp, err := DialPath(ctx, pc)
	if err != nil {
		return nil, err
	}
	return &pathConn{c: (*Client)(t), p: p, cp: cp}, nil
}

// pathConn is one connect of a path (session.Conn): the service
// connection, kept here, and the IO connections, handed to the queues.
type pathConn struct {
	c        *Client
	p        *session.Path
	cp       *ClientPath
	gen      uint64 // the connect's number (session.Path.Failed)
	attached bool
}

func (pc *pathConn) Params() Params { return pc.cp.Params }

// Attach gives IO connection i+1 to queue i and keeps cid 0 for heartbeats.
func (pc *pathConn) Attach(gen uint64) error {
	conns := pc.cp.Conns
	fds := make([]int, 0, len(conns)-1)
	for _, cc := range conns[1:] {
		fd, err := rawFD(cc.NetConn())
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return err
		}
		fds = append(fds, fd)
	}
	for _, cc := range conns[1:] {
		cc.Close() // the queues own duplicates of the sockets
	}
	pc.attached, pc.gen = true, gen
	p := pc.p
	for i, q := range pc.c.queues {
		// A connection of this path that a queue has not taken yet (no
		// loop drives it: RNBD's queues of an unmapped device) belongs
		// to an earlier connect, which failed: close it rather than let
		// every reconnect add one more.
		q.core.ReplaceAttach(attachMsg{path: p, fd: fds[i], gen: gen},
			func(old attachMsg) bool { return old.path == p },
			func(old attachMsg) { unix.Close(old.fd) })
	}
	return nil
}

// Close takes the path's connections away from the queues, which fail its
// requests over to other paths.
func (pc *pathConn) Close() {
	if !pc.attached {
		pc.cp.Close()
		return
	}
	pc.cp.Conns[0].Close()
	for _, q := range pc.c.queues {
		q.core.PostDetach(pc.p, pc.gen)
	}
}

// rawFD returns a non-blocking duplicate of a TCP connection's socket.
func rawFD(nc net.Conn) (int, error) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return -1, fmt.Errorf("rtrs/tcp client: %T is not a TCP connection", nc)
	}
	f, err := tc.File()
	if err != nil {
		return -1, err
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Serve runs the service connection while the path is up: heartbeats and
// their answers, fences and theirs, until the path stops.
func (pc *pathConn) Serve(p *session.Path) {
	nc := pc.cp.Conns[0].NetConn()
	interval := pc.c.s.Config().HeartbeatInterval
	dec := frame.NewDecoder(frame.ToClient)
	dec.SetSession(pc.c.params.Codec, nil)
	acks := make(chan struct{}, 16)
	fenced := make(chan rtrs.FenceRsp, 16)
	readErr := make(chan error, 1)
	go func() { // ends when Close closes the socket
		for {
			f, err := dec.ReadFrame(nc)
			if err != nil {
				readErr <- err
				return
			}
			if f.IsCtrl() {
				var rsp rtrs.FenceRsp
				if f.Ctrl != frame.CtrlFenceRsp || rsp.Unmarshal(f.Payload) != nil {
					readErr <- fmt.Errorf("unexpected %v on the service connection: %w", f.Ctrl, rtrs.ErrBadType)
					return
				}
				select {
				case fenced <- rsp:
				default:
				}
				continue
			}
			if f.Imm.Type == rtrs.ImmHBAck {
				select {
				case acks <- struct{}{}:
				default:
				}
			}
		}
	}()
	var hb [frame.HeaderSize]byte
	frame.HeartbeatHeader(false).MarshalTo(hb[:])
	write := func(b []byte) bool {
		_ = nc.SetWriteDeadline(time.Now().Add(interval))
		if _, err := nc.Write(b); err != nil {
			p.Failed(pc.gen, "service connection: %v", err)
			return false
		}
		return true
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for !p.Stopping() {
		if p.HeartbeatDue(time.Now()) && !write(hb[:]) {
			return
		}
		if target, ok := p.NextFence(); ok {
			var b [frame.HeaderSize + rtrs.FenceReqSize]byte
			n, err := frame.PutCtrl(b[:], frame.CtrlFenceReq, &rtrs.FenceReq{SessUUID: target})
			if err != nil || !write(b[:n]) {
				p.FenceAnswered(int(syscall.EIO))
				return
			}
		}
		timer.Reset(time.Until(p.NextHeartbeat()))
		select {
		case <-p.Wakeups():
		case <-timer.C:
		case <-acks:
			p.HeartbeatAcked()
		case rsp := <-fenced:
			p.Alive()
			p.FenceAnswered(int(-rsp.Errno))
		case err := <-readErr:
			p.Failed(pc.gen, "service connection: %v", err)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}
