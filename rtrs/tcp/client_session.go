package tcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
)

// ClientConfig describes a client session.
type ClientConfig struct {
	// SessName is the session name (rtrs.CheckSessName).
	SessName string
	// Paths are the session's paths: server addresses "host:port", each
	// optionally with a local address to connect from.
	Paths []PathAddr
	// Queues is the number of per-CPU queues, and so of IO connections per
	// path (cid 1..Queues; cid 0 is the service connection); default the
	// number of CPUs.
	Queues int
	// AdminQueue adds one more queue (and connection per path) after the
	// per-CPU ones, for control messages such as RNBD's session info, open
	// and close: its owner runs it on a thread of its own (Client.Admin).
	AdminQueue bool
	// Policy picks the path of each request.
	Policy rtrs.MPPolicy
	// MaxReconnectAttempts bounds the reconnects of a path after it failed:
	// -1 forever (the kernel's default), 0 none.
	MaxReconnectAttempts int
	// ReconnectDelay is waited before each reconnect attempt; default
	// rtrs.ReconnectBackoff.
	ReconnectDelay time.Duration
	// HeartbeatInterval and MissedHeartbeats: a path whose server does not
	// answer MissedHeartbeats heartbeats in a row is failed; defaults
	// rtrs.HBInterval and rtrs.HBMissedMax.
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
	// Timeout bounds each connection's setup; default rtrs.ConnectTimeout.
	Timeout time.Duration
	// OnLinkEvent, if set, is told when the session loses its last
	// connected path and when a path comes back after that, with the
	// number of such reconnects (rtrs.Link). It runs on a path goroutine
	// and must not block.
	OnLinkEvent func(ev rtrs.LinkEvent, gen uint64)
	// HoldIOOnReconnect: after such a reconnect the queues send no
	// request until ResumeIO (the admin queue excepted), so that the
	// user can set up again what a restarted server lost (RNBD reopens
	// its devices).
	HoldIOOnReconnect bool
}

// PathAddr is one path: Dst is the server's "host:port", Src optionally
// the local IP to connect from.
type PathAddr = rtrs.PathAddr

// Path states of a client path (ClientPathInfo.State names them).
const (
	PathStateConnecting   = rtrs.PathStateConnecting
	PathStateConnected    = rtrs.PathStateConnected
	PathStateReconnecting = rtrs.PathStateReconnecting
	PathStateDisconnected = rtrs.PathStateDisconnected
	PathStateRemoved      = rtrs.PathStateRemoved
)

// PathStateName returns "connecting", "connected", ... (rtrs.PathStateName).
func PathStateName(s int32) string { return rtrs.PathStateName(s) }

// Client is an RTRS client session over TCP: its paths, each with one IO
// connection per queue, and the queues that carry requests.
type Client struct {
	cfg       ClientConfig
	pathsUUID rtrs.UUID
	params    Params
	queueSet  *rtrs.QueueSet // permits, shared by the queues
	queues    []*ClientQueue
	link      *rtrs.Link

	mu      sync.Mutex // control plane: paths, closing
	paths   []*clientPath
	closed  bool
	closing chan struct{} // closed by Close
	wg      sync.WaitGroup
	// maxRecon is max_reconnect_attempts (ClientConfig.MaxReconnectAttempts,
	// SetMaxReconnectAttempts), read by the path goroutines.
	maxRecon rtrs.ReconnectLimit
}

// clientPath is one path of a client session and its control goroutine.
type clientPath struct {
	c        *Client
	idx      int
	addr     PathAddr
	sessUUID rtrs.UUID
	state    rtrs.PathState
	connGen  atomic.Uint64 // counts the path's connects and detaches: queues report failures of the current connect only
	rttNS    atomic.Int64
	connErr  rtrs.ConnectError // why the last connect attempt failed
	stats    *rtrs.ClientPathStats
	reconCnt uint16
	everUp   bool

	kick chan pathCmd // failure reports and user commands
	svc  *ClientConn  // service connection while connected
	// fences carries fence requests of other paths to this path's
	// heartbeat loop, which sends them on its service connection.
	fences chan fenceCall
	// fencedGen is the newest connect (connGen) of the path that the
	// server is known to have closed: the queues resend the requests of
	// its connections of that connect or older only then.
	fencedGen rtrs.FencedGen
}

// fenceCall is a fence request handed to another path's heartbeat loop.
type fenceCall struct {
	target rtrs.UUID
	done   chan error // buffered: the loop never blocks on it
}

type pathCmd int

const (
	cmdFailed     pathCmd = iota // an IO connection failed
	cmdReconnect                 // user: reconnect now
	cmdDisconnect                // user: disconnect, no automatic reconnect
	cmdRemove                    // user: remove the path
	cmdClose                     // session closing
)

// Usable implements rtrs.PathLoad.
func (p *clientPath) Usable() bool    { return p.state.Load() == PathStateConnected }
func (p *clientPath) Inflight() int64 { return p.stats.Inflight() }
func (p *clientPath) Latency() int64  { return p.rttNS.Load() }

func (p *clientPath) report(cmd pathCmd) {
	select {
	case p.kick <- cmd:
	default:
		if cmd != cmdFailed {
			go func() { p.kick <- cmd }()
		}
	}
}

func newUUID() rtrs.UUID {
	var u rtrs.UUID
	_, _ = rand.Read(u[:])
	return u
}

// nqueues returns the number of queues, the admin queue included.
func (cfg *ClientConfig) nqueues() int {
	if cfg.AdminQueue {
		return cfg.Queues + 1
	}
	return cfg.Queues
}

func (cfg *ClientConfig) setDefaults() error {
	if cfg.Queues == 0 {
		cfg.Queues = runtime.NumCPU()
	}
	if cfg.Queues < 1 {
		return fmt.Errorf("rtrs/tcp client: %d queues: %w", cfg.Queues, syscall.EINVAL)
	}
	if err := rtrs.CheckClientSession(cfg.SessName, len(cfg.Paths), cfg.nqueues()+1, cfg.MaxReconnectAttempts); err != nil {
		return fmt.Errorf("rtrs/tcp client: %w", err)
	}
	t := rtrs.ClientTimers{ReconnectDelay: cfg.ReconnectDelay, HeartbeatInterval: cfg.HeartbeatInterval,
		MissedHeartbeats: cfg.MissedHeartbeats, Timeout: cfg.Timeout}.WithDefaults()
	cfg.ReconnectDelay, cfg.HeartbeatInterval, cfg.MissedHeartbeats, cfg.Timeout = t.ReconnectDelay, t.HeartbeatInterval, t.MissedHeartbeats, t.Timeout
	return nil
}

// DialClient opens a session: it connects every path (at least one must
// connect; the others keep trying in the background, as the kernel client
// does) and returns the client with its queues, which the caller runs
// (ClientQueue.Run).
func DialClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, pathsUUID: newUUID(), link: rtrs.NewLink(cfg.HoldIOOnReconnect, cfg.OnLinkEvent),
		closing: make(chan struct{})}
	_ = c.maxRecon.Set(cfg.MaxReconnectAttempts) // checked by setDefaults
	var first error
	var conns [][]*ClientConn
	for i, a := range cfg.Paths {
		p := c.newPath(i, a)
		cp, err := p.dial(ctx, i == 0 || c.queueSet != nil)
		p.connErr.Set(err)
		if err != nil {
			if first == nil {
				first = err
			}
			conns = append(conns, nil)
			continue
		}
		if c.queueSet == nil {
			c.params = cp.Params
			c.queueSet = rtrs.NewQueueSet(rtrs.NewPermits(cp.Params.QueueDepth))
		} else if cp.Params != c.params {
			cp.Close()
			return nil, c.abort(fmt.Errorf("rtrs/tcp client: path %s announced %+v, the first path %+v: %w", a, cp.Params, c.params, syscall.EPROTO))
		}
		conns = append(conns, cp.Conns)
	}
	if c.queueSet == nil {
		return nil, c.abort(fmt.Errorf("rtrs/tcp client: no path connected: %w", first))
	}
	for i := 0; i < cfg.nqueues(); i++ {
		q, err := newClientQueue(c, i)
		if err != nil {
			return nil, c.abort(err)
		}
		c.queues = append(c.queues, q)
	}
	if cfg.AdminQueue {
		c.queues[cfg.Queues].unheld = true
		c.queues[cfg.Queues].reqs.SetAdmin()
	}
	for i, p := range c.paths {
		c.wg.Add(1)
		go p.run(conns[i])
	}
	return c, nil
}

func (c *Client) abort(err error) error {
	c.Close()
	return err
}

func (c *Client) newPath(idx int, a PathAddr) *clientPath {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newPathLocked(idx, a)
}

// newPathLocked is newPath with c.mu held.
func (c *Client) newPathLocked(idx int, a PathAddr) *clientPath {
	p := &clientPath{c: c, idx: idx, addr: a, sessUUID: newUUID(), kick: make(chan pathCmd, 1), fences: make(chan fenceCall)}
	p.state.Bind(c.link)
	p.state.Store(PathStateConnecting)
	p.stats = rtrs.NewClientPathStats(c.cfg.Queues)
	c.paths = append(c.paths, p)
	return p
}

// Params returns the session parameters the server announced.
func (c *Client) Params() Params { return c.params }

// Queue returns queue i (0..Queues-1).
func (c *Client) Queue(i int) *ClientQueue { return c.queues[i] }

// Queues returns the number of per-CPU queues (the admin queue excluded).
func (c *Client) Queues() int { return c.cfg.Queues }

// Admin returns the admin queue, or nil without ClientConfig.AdminQueue.
func (c *Client) Admin() *ClientQueue {
	if !c.cfg.AdminQueue {
		return nil
	}
	return c.queues[c.cfg.Queues]
}

// ResumeIO lets the queues send again after reconnect gen
// (ClientConfig.HoldIOOnReconnect). It does nothing for an older
// reconnect than the last.
func (c *Client) ResumeIO(gen uint64) {
	if c.link.Resume(gen) {
		c.wakeQueues()
	}
}

// Permits returns the session's permit pool (its in-use count is the
// session's requests in flight).
func (c *Client) Permits() *rtrs.Permits { return c.queueSet.Permits() }

// SetPolicy changes the multipath policy.
func (c *Client) SetPolicy(p rtrs.MPPolicy) {
	c.mu.Lock()
	c.cfg.Policy = p
	c.mu.Unlock()
	for _, q := range c.queues {
		q.post(qmsg{kind: msgPolicy, policy: p})
	}
}

// ClientPathInfo is a snapshot of a client path.
type ClientPathInfo = rtrs.ClientPathInfo

// Paths returns a snapshot of the session's paths.
func (c *Client) Paths() []ClientPathInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ClientPathInfo
	for _, p := range c.paths {
		out = append(out, ClientPathInfo{
			Index: p.idx, Addr: p.addr, State: PathStateName(p.state.Load()),
			RTT: time.Duration(p.rttNS.Load()), LastError: p.connErr.String(), Stats: p.stats,
		})
	}
	return out
}

func (c *Client) path(idx int) (*clientPath, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if idx < 0 || idx >= len(c.paths) || c.paths[idx].state.Load() == PathStateRemoved {
		return nil, fmt.Errorf("rtrs/tcp client: no path %d: %w", idx, syscall.ENOENT)
	}
	return c.paths[idx], nil
}

// AddPath adds a path to the live session and connects it in the
// background; it returns the path's index.
func (c *Client) AddPath(a PathAddr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	// Checked and added under c.mu: two AddPaths at once get distinct
	// indexes, and Close waits for the new path too.
	if err := rtrs.CheckAddPath(a, len(c.paths), func(i int) (PathAddr, bool) {
		p := c.paths[i]
		return p.addr, p.state.Load() != PathStateRemoved
	}); err != nil {
		return 0, fmt.Errorf("rtrs/tcp client: %w", err)
	}
	p := c.newPathLocked(len(c.paths), a)
	c.wg.Add(1)
	go p.run(nil)
	return p.idx, nil
}

// RemovePath closes path idx and removes it; its requests fail over.
func (c *Client) RemovePath(idx int) error { return c.pathCmd(idx, cmdRemove) }

// DisconnectPath closes path idx and keeps it, without reconnecting.
func (c *Client) DisconnectPath(idx int) error { return c.pathCmd(idx, cmdDisconnect) }

// ReconnectPath closes path idx and connects it again.
func (c *Client) ReconnectPath(idx int) error { return c.pathCmd(idx, cmdReconnect) }

// SetMaxReconnectAttempts changes max_reconnect_attempts for every path:
// how many reconnects a failed path tries before it stays disconnected
// (-1: forever, 0: none). It applies from the next attempt; a path that
// already gave up waits for ReconnectPath.
func (c *Client) SetMaxReconnectAttempts(n int) error {
	if err := c.maxRecon.Set(n); err != nil {
		return fmt.Errorf("rtrs/tcp client: %w", err)
	}
	return nil
}

// MaxReconnectAttempts returns the current max_reconnect_attempts.
func (c *Client) MaxReconnectAttempts() int { return c.maxRecon.Get() }

func (c *Client) pathCmd(idx int, cmd pathCmd) error {
	p, err := c.path(idx)
	if err != nil {
		return err
	}
	p.report(cmd)
	return nil
}

// Close ends the session: every path is closed, requests still waiting
// fail with -ENOTCONN, and the queues' Run loops return.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	paths := append([]*clientPath(nil), c.paths...)
	c.mu.Unlock()
	for _, p := range paths {
		p.report(cmdClose)
	}
	c.wg.Wait()
	for _, q := range c.queues {
		q.post(qmsg{kind: msgClose})
	}
	// Queues that no loop drives will not read the message: close their
	// sockets here. A queue driven now closes them when its loop stops
	// (Detach).
	for _, q := range c.queues {
		q.closeUndriven()
	}
	return nil
}

// anyHope reports whether some path carries requests or may again.
func (c *Client) anyHope() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	for _, p := range c.paths {
		if rtrs.PathHasHope(p.state.Load()) {
			return true
		}
	}
	return false
}

// dial connects the path's cid 0..Queues.
func (p *clientPath) dial(ctx context.Context, firstConn bool) (*ClientPath, error) {
	cfg := PathConfig{
		Addr: p.addr.Dst, SessName: p.c.cfg.SessName, PathsUUID: p.c.pathsUUID, SessUUID: p.sessUUID,
		CIDNum: p.c.cfg.nqueues() + 1, FirstConn: firstConn || p.everUp, ReconCnt: p.reconCnt, Timeout: p.c.cfg.Timeout,
		Fence: true,
	}
	if p.addr.Src != "" {
		ip := net.ParseIP(p.addr.Src)
		if ip == nil {
			return nil, fmt.Errorf("rtrs/tcp client: source address %q: %w", p.addr.Src, syscall.EINVAL)
		}
		cfg.LocalAddr = &net.TCPAddr{IP: ip}
	}
	p.reconCnt++
	cp, err := DialPath(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("path %s: %w", p.addr, err)
	}
	return cp, nil
}

// run is the path's control goroutine: it hands the IO connections to the
// queues, sends heartbeats on the service connection, and on failure takes
// the path down (the queues fail its requests over) and reconnects.
func (p *clientPath) run(conns []*ClientConn) {
	defer p.c.wg.Done()
	attempts := 0
	for {
		if conns == nil {
			if p.state.Load() == PathStateDisconnected {
				// Wait for a user command.
				switch <-p.kick {
				case cmdReconnect:
					attempts = 0
				case cmdRemove, cmdClose:
					p.state.Store(PathStateRemoved)
					return
				default:
					continue
				}
			}
			if p.everUp || attempts > 0 {
				d := p.c.cfg.ReconnectDelay + time.Duration(time.Now().UnixNano()%int64(rtrs.ReconnectSeed))
				select {
				case cmd := <-p.kick:
					if p.stopFor(cmd) {
						return
					}
				case <-time.After(d):
				}
			}
			if p.everUp && p.c.maxRecon.Reached(attempts) {
				// Given up: the path stays, disconnected, until the
				// user reconnects it.
				p.state.Store(PathStateDisconnected)
				p.c.wakeQueues()
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), p.c.cfg.Timeout)
			cp, err := p.dial(ctx, false)
			cancel()
			attempts++
			p.connErr.Set(err)
			if err != nil {
				if p.everUp {
					p.stats.ReconnectFailed()
				}
				continue
			}
			if cp.Params != p.c.params {
				// The kernel disables reconnect when the depth changes.
				cp.Close()
				p.state.Store(PathStateDisconnected)
				p.c.wakeQueues()
				continue
			}
			conns = cp.Conns
		}
		attempts = 0
		p.everUp = true
		p.stats.ReconnectSucceeded()
		if err := p.attach(conns); err != nil {
			conns = nil
			p.state.Store(PathStateReconnecting)
			continue
		}
		conns = nil
		cmd := p.heartbeat()
		gen := p.connGen.Load() // the connect being taken down
		p.detach()
		if cmd != cmdClose && p.c.fencing() {
			p.c.wg.Add(1)
			go p.fenceLoop(gen)
		}
		switch cmd {
		case cmdClose, cmdRemove:
			p.state.Store(PathStateRemoved)
			p.c.wakeQueues()
			return
		case cmdDisconnect:
			p.state.Store(PathStateDisconnected)
		default:
			p.state.Store(PathStateReconnecting)
		}
		p.c.wakeQueues()
	}
}

// stopFor handles a command received while waiting to reconnect.
func (p *clientPath) stopFor(cmd pathCmd) bool {
	switch cmd {
	case cmdClose, cmdRemove:
		p.state.Store(PathStateRemoved)
		return true
	case cmdDisconnect:
		p.state.Store(PathStateDisconnected)
	}
	return false
}

// attach gives IO connection i+1 to queue i and keeps cid 0 for heartbeats.
func (p *clientPath) attach(conns []*ClientConn) error {
	fds := make([]int, 0, len(conns)-1)
	fail := func(err error) error {
		for _, fd := range fds {
			unix.Close(fd)
		}
		for _, cc := range conns {
			cc.Close()
		}
		return err
	}
	for _, cc := range conns[1:] {
		fd, err := rawFD(cc.NetConn())
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
	}
	for _, cc := range conns[1:] {
		cc.Close() // the queues own duplicates of the sockets
	}
	p.svc = conns[0]
	// The server took this connect: it has closed the path's earlier
	// ones (it accepts a path's sess_uuid anew only then), so their
	// requests may go again, here too.
	p.markFenced(p.connGen.Load())
	gen := p.connGen.Add(1)
	p.state.Store(PathStateConnected)
	for i, q := range p.c.queues {
		// A connection of this path that a queue has not taken yet (no
		// loop drives it: RNBD's queues of an unmapped device) belongs
		// to an earlier connect, which failed: close it rather than let
		// every reconnect add one more.
		q.mbox.Replace(qmsg{kind: msgAttach, path: p, fd: fds[i], gen: gen},
			func(old qmsg) bool { return old.kind == msgAttach && old.path == p },
			func(old qmsg) { unix.Close(old.fd) })
	}
	return nil
}

// detach takes the path's connections away from the queues, which fail its
// requests over to other paths.
func (p *clientPath) detach() {
	if p.svc != nil {
		p.svc.Close()
		p.svc = nil
	}
	if p.state.Load() == PathStateConnected {
		p.state.Store(PathStateReconnecting)
	}
	p.connGen.Add(1)
	for _, q := range p.c.queues {
		q.post(qmsg{kind: msgDetach, path: p})
	}
}

// fencing reports whether the server fences paths (rtrs.FlagFence).
func (c *Client) fencing() bool { return c.params.Flags&rtrs.FlagFence != 0 }

// fenceRetry is how often a path that went down tries again to have the
// server fence it through another path.
const fenceRetry = 50 * time.Millisecond

// fenceLoop has the server close connect gen of p, through another
// connected path, so that the requests p carried may go again: the server
// then starts none of the copies it may still have unread. It ends when
// that is done, when p connected again (which fences it too) or when the
// client closes.
func (p *clientPath) fenceLoop(gen uint64) {
	defer p.c.wg.Done()
	for p.fencedGen.Load() < gen {
		p.c.mu.Lock()
		closed := p.c.closed
		others := make([]*clientPath, 0, len(p.c.paths))
		for _, o := range p.c.paths {
			if o != p && o.state.Load() == PathStateConnected {
				others = append(others, o)
			}
		}
		p.c.mu.Unlock()
		if closed {
			return
		}
		for _, o := range others {
			if o.fence(p.sessUUID) == nil {
				p.markFenced(gen)
				return
			}
		}
		select {
		case <-p.c.closing:
			return
		case <-time.After(fenceRetry):
		}
	}
}

// fence asks the server, on p's service connection, to close the path
// target, and waits for the answer.
func (p *clientPath) fence(target rtrs.UUID) error {
	timeout := time.NewTimer(p.c.cfg.HeartbeatInterval * time.Duration(p.c.cfg.MissedHeartbeats+1))
	defer timeout.Stop()
	fc := fenceCall{target: target, done: make(chan error, 1)}
	select {
	case p.fences <- fc:
	case <-timeout.C:
		return syscall.ETIMEDOUT
	case <-p.c.closing:
		return syscall.ENOTCONN
	}
	select {
	case err := <-fc.done:
		return err
	case <-timeout.C:
		return syscall.ETIMEDOUT
	case <-p.c.closing:
		return syscall.ENOTCONN
	}
}

// markFenced records that the server has closed p's connects up to gen and
// lets the queues resend their requests.
func (p *clientPath) markFenced(gen uint64) {
	if !p.fencedGen.Advance(gen) {
		return
	}
	for _, q := range p.c.queues {
		q.post(qmsg{kind: msgFenced, path: p, gen: gen})
	}
}

func (c *Client) wakeQueues() {
	for _, q := range c.queues {
		q.post(qmsg{kind: msgRetry})
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

// heartbeat runs on the service connection while the path is up: a
// heartbeat every interval, each answer's round trip recorded; it returns
// when the server missed too many, the connection failed, or a command
// arrived.
func (p *clientPath) heartbeat() pathCmd {
	nc := p.svc.NetConn()
	dec := NewDecoder(ToClient)
	dec.SetSession(p.c.params.Codec, nil)
	acks := make(chan time.Time, 16)
	readErr := make(chan error, 1)
	fenced := make(chan rtrs.FenceRsp, 16)
	go func() {
		for {
			f, err := dec.ReadFrame(nc)
			if err != nil {
				readErr <- err
				return
			}
			if f.IsCtrl() {
				var rsp rtrs.FenceRsp
				if f.Ctrl != CtrlFenceRsp || rsp.Unmarshal(f.Payload) != nil {
					readErr <- fmt.Errorf("rtrs/tcp client: unexpected %v on the service connection: %w", f.Ctrl, rtrs.ErrBadType)
					return
				}
				select {
				case fenced <- rsp:
				default: // more answers than fences: not ours to block on
				}
				continue
			}
			if f.Imm.Type == rtrs.ImmHBAck {
				select {
				case acks <- time.Now():
				default:
				}
			}
		}
	}()
	// Fences sent and not answered yet, in order.
	var pending []fenceCall
	defer func() {
		for _, fc := range pending {
			fc.done <- fmt.Errorf("rtrs/tcp client: path %s went down before the fence was answered: %w", p.addr, syscall.ENOTCONN)
		}
	}()
	var hb [HeaderSize]byte
	HeartbeatHeader(false).MarshalTo(hb[:])
	tick := time.NewTicker(p.c.cfg.HeartbeatInterval)
	defer tick.Stop()
	missed := 0
	var sentAt time.Time
	send := func() bool {
		_ = nc.SetWriteDeadline(time.Now().Add(p.c.cfg.HeartbeatInterval))
		sentAt = time.Now()
		_, err := nc.Write(hb[:])
		return err == nil
	}
	if !send() {
		return cmdFailed
	}
	for {
		select {
		case cmd := <-p.kick:
			if cmd == cmdFailed {
				return cmdFailed
			}
			return cmd
		case err := <-readErr:
			_ = err
			return cmdFailed
		case at := <-acks:
			missed = 0
			p.rttNS.Store(int64(at.Sub(sentAt)))
		case fc := <-p.fences:
			var b [HeaderSize + rtrs.FenceReqSize]byte
			n, err := PutCtrl(b[:], CtrlFenceReq, &rtrs.FenceReq{SessUUID: fc.target})
			if err == nil {
				_ = nc.SetWriteDeadline(time.Now().Add(p.c.cfg.HeartbeatInterval))
				_, err = nc.Write(b[:n])
			}
			if err != nil {
				fc.done <- err
				return cmdFailed
			}
			pending = append(pending, fc)
		case rsp := <-fenced:
			for i, fc := range pending {
				if fc.target == rsp.SessUUID {
					if rsp.Errno != 0 {
						fc.done <- fmt.Errorf("rtrs/tcp client: fence refused: %w", syscall.Errno(-rsp.Errno))
					} else {
						fc.done <- nil
					}
					pending = append(pending[:i], pending[i+1:]...)
					break
				}
			}
		case <-tick.C:
			missed++
			if missed > p.c.cfg.MissedHeartbeats {
				return cmdFailed
			}
			if !send() {
				return cmdFailed
			}
		}
	}
}
