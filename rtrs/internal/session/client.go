package session

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// Transport is what the session layer needs of a transport.
type Transport interface {
	// CheckPath checks a path's addresses before the path is made (for
	// New and AddPath); errors are the user's.
	CheckPath(a rtrs.PathAddr) error
	// Connect makes one connect of path p: every connection (cid
	// 0..Config().CIDNum()-1, with p.ConnReq) and the INFO exchange,
	// within ctx. On error it has freed what it made.
	Connect(ctx context.Context, p *Path) (Conn, error)
	// Start is called once, before the first connect is attached, with
	// the session parameters of that connect: the transport makes its
	// queues.
	Start(params rtrs.Params) error
	// WakeQueues has every queue look again at its waiting requests: a
	// path came, went or lost hope.
	WakeQueues()
	// Fenced tells the queues that the server has closed path p's
	// connects up to gen, so the requests they held back may go again.
	Fenced(p *Path, gen uint64)
	// SetPolicy hands a new multipath policy to the queues.
	SetPolicy(pol rtrs.MPPolicy)
	// WakeQueues, Fenced and SetPolicy are called only once Start has
	// returned (its writes happen before them): the queues need no lock.
}

// Conn is one connect of a path: its connections while they live.
type Conn interface {
	// Params are the session parameters the server announced.
	Params() rtrs.Params
	// Attach hands the IO connections to the queues; gen numbers the
	// connect (Path.Failed). On error nothing was handed over.
	Attach(gen uint64) error
	// Serve runs the service connection, heartbeats (Path.HeartbeatDue)
	// and fences (Path.NextFence), until Path.Stopping.
	Serve(p *Path)
	// Close takes the connections from the queues, whose requests on
	// them fail over, and frees them; after Attach or instead of it.
	Close()
}

// Session is the transport-neutral part of a client session, as its
// transport sees it; API is what the transport passes on to its users.
type Session struct {
	cfg       rtrs.ClientConfig
	tr        Transport
	pathsUUID rtrs.UUID
	link      *Link
	maxRecon  ReconnectLimit

	params  rtrs.Params // set once, by the first connect (started)
	started atomic.Bool

	startMu sync.Mutex // start, and SetPolicy against it
	mu      sync.Mutex // paths, policy
	paths   []*Path
	policy  rtrs.MPPolicy
	closed  atomic.Bool
	closing chan struct{} // closed by Close
	// stop is cancelled by Close: it ends the connect attempts under way.
	stop       context.Context
	cancelStop context.CancelFunc
	wg         sync.WaitGroup
}

// New makes a session for tr from cfg, which must be checked
// (rtrs.ClientConfig.Checked). Its paths start with Dial.
func New(cfg rtrs.ClientConfig, tr Transport) (*Session, error) {
	c := &Session{cfg: cfg, tr: tr, policy: cfg.Policy, link: NewLink(cfg.HoldIOOnReconnect, cfg.OnLinkEvent),
		closing: make(chan struct{})}
	c.stop, c.cancelStop = context.WithCancel(context.Background())
	if err := c.maxRecon.Set(cfg.MaxReconnectAttempts); err != nil {
		return nil, err
	}
	_, _ = rand.Read(c.pathsUUID[:])
	for _, a := range cfg.Paths {
		if err := tr.CheckPath(a); err != nil {
			return nil, err
		}
		c.paths = append(c.paths, c.newPath(len(c.paths), a, true))
	}
	return c, nil
}

// Dial starts every path and returns as soon as one has connected: the
// others go on trying in the background, so that a dead path does not
// hold up the session (nor eat its caller's deadline). It fails, with
// every path's reason, when each path's first attempt failed or ctx
// ended first.
func (c *Session) Dial(ctx context.Context) error {
	c.mu.Lock()
	paths := append([]*Path(nil), c.paths...)
	for _, p := range paths {
		c.wg.Add(1)
		go p.run()
	}
	c.mu.Unlock()
	outcomes := make(chan error, len(paths))
	for _, p := range paths {
		go func() {
			select {
			case err := <-p.first:
				if err != nil {
					err = fmt.Errorf("path %v: %w", p.addr, err)
				}
				outcomes <- err
			case <-ctx.Done():
				outcomes <- fmt.Errorf("path %v: %w", p.addr, ctx.Err())
			}
		}()
	}
	var errs []error
	for range paths {
		err := <-outcomes
		if err == nil && c.started.Load() {
			return nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("no path connected: %w", syscall.ENOTCONN))
	}
	return errors.Join(errs...)
}

// API is the control plane of a session that its transport's client
// offers its users, by embedding it.
type API struct{ s *Session }

// API returns the session's user API.
func (c *Session) API() API { return API{c} }

// Config returns the session's configuration, defaults applied.
func (c *Session) Config() *rtrs.ClientConfig { return &c.cfg }

// PathsUUID returns the session's uuid (rtrs.ConnReq.PathsUUID).
func (c *Session) PathsUUID() rtrs.UUID { return c.pathsUUID }

// Link returns the session's link state (HoldIOOnReconnect).
func (c *Session) Link() *Link { return c.link }

// Params returns the session parameters the server announced on the
// session's first connect.
func (a API) Params() rtrs.Params { return a.s.params }

// Params returns the session parameters of the first connect.
func (c *Session) Params() rtrs.Params { return c.params }

// Fencing reports whether the server fences paths (rtrs.FlagFence).
func (c *Session) Fencing() bool { return c.params.Flags&rtrs.FlagFence != 0 }

// Closed reports whether Close has begun.
func (c *Session) Closed() bool { return c.closed.Load() }

// Logf logs through Config().Logf, if set.
func (c *Session) Logf(format string, args ...any) {
	if l := c.cfg.Logf; l != nil {
		l(format, args...)
	}
}

// start fixes the session parameters on the first connect and has the
// transport make its queues; a later connect must announce the same.
func (c *Session) start(params rtrs.Params) error {
	c.startMu.Lock()
	defer c.startMu.Unlock()
	if c.started.Load() {
		if params != c.params {
			return fmt.Errorf("%w: %+v, the session has %+v", errParamsChanged, params, c.params)
		}
		return nil
	}
	if err := c.tr.Start(params); err != nil {
		return err
	}
	c.params = params
	c.started.Store(true)
	return nil
}

var errParamsChanged = fmt.Errorf("the server announced other session parameters: %w", syscall.EPROTO)

// ResumeIO lets the queues send again after reconnect gen
// (HoldIOOnReconnect). It does nothing for an older reconnect than the
// last.
func (a API) ResumeIO(gen uint64) {
	c := a.s
	if c.link.Resume(gen) {
		c.wakeQueues()
	}
}

// Policy returns the multipath policy.
func (a API) Policy() rtrs.MPPolicy {
	c := a.s
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.policy
}

// SetPolicy changes the multipath policy.
func (a API) SetPolicy(pol rtrs.MPPolicy) {
	c := a.s
	// Under startMu: a Start under way reads the policy before or after
	// this, never misses it.
	c.startMu.Lock()
	defer c.startMu.Unlock()
	c.mu.Lock()
	c.policy = pol
	c.mu.Unlock()
	if c.started.Load() {
		c.tr.SetPolicy(pol)
	}
}

// wakeQueues is Transport.WakeQueues once there are queues.
func (c *Session) wakeQueues() {
	if c.started.Load() {
		c.tr.WakeQueues()
	}
}

// Paths returns a snapshot of the session's paths, by index.
func (a API) Paths() []rtrs.ClientPathInfo {
	c := a.s
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]rtrs.ClientPathInfo, len(c.paths))
	for i, p := range c.paths {
		out[i] = rtrs.ClientPathInfo{Index: i, Addr: p.addr, State: PathStateName(p.state.Load()),
			RTT: time.Duration(p.rtt.Load()), LastError: p.connErr.String(), Stats: p.stats}
	}
	return out
}

// EachPath calls fn for every path, removed ones included, with the
// session's path list locked: fn must not call back into c.
func (c *Session) EachPath(fn func(p *Path)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.paths {
		fn(p)
	}
}

// AddPath adds a path to the live session and connects it in the
// background; it returns the path's index (in Paths and for the other
// path methods). The path must not be one of the session's (EEXIST), and
// a session has at most rtrs.MaxPathsNum paths, removed ones included
// (ENOMEM).
func (s API) AddPath(a rtrs.PathAddr) (int, error) {
	c := s.s
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return 0, fmt.Errorf("add path %v: %w", a, net.ErrClosed)
	}
	if err := rtrs.CheckAddPath(a, len(c.paths), func(i int) (rtrs.PathAddr, bool) {
		p := c.paths[i]
		return p.addr, p.state.Load() != PathStateRemoved
	}); err != nil {
		return 0, err
	}
	if err := c.tr.CheckPath(a); err != nil {
		return 0, fmt.Errorf("add path %v: %w", a, err)
	}
	p := c.newPath(len(c.paths), a, false)
	c.paths = append(c.paths, p)
	c.wg.Add(1) // under c.mu, so that Close waits for this path too
	go p.run()
	return p.idx, nil
}

// RemovePath disconnects path idx and removes it from the session; its
// requests fail over. The index stays taken (state "removed").
func (a API) RemovePath(idx int) error { return a.s.command(idx, cmdRemove) }

// DisconnectPath disconnects path idx and keeps it, disconnected, until
// ReconnectPath; its requests fail over.
func (a API) DisconnectPath(idx int) error { return a.s.command(idx, cmdDisconnect) }

// ReconnectPath disconnects path idx if it is connected and connects it
// again at once, with a fresh count of attempts; it also brings back a
// path that was disconnected or had given up.
func (a API) ReconnectPath(idx int) error { return a.s.command(idx, cmdReconnect) }

func (c *Session) command(idx int, cmd int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("path %d: %w", idx, net.ErrClosed)
	}
	if idx < 0 || idx >= len(c.paths) || c.paths[idx].state.Load() == PathStateRemoved {
		return fmt.Errorf("no path %d: %w", idx, syscall.ENOENT)
	}
	c.paths[idx].command(cmd)
	return nil
}

// SetMaxReconnectAttempts changes max_reconnect_attempts for every path:
// how many failed attempts in a row a path makes before it stays
// disconnected (-1: forever, 0: none). It applies from the next attempt;
// a path that already gave up waits for ReconnectPath.
func (a API) SetMaxReconnectAttempts(n int) error { return a.s.maxRecon.Set(n) }

// MaxReconnectAttempts returns the current max_reconnect_attempts.
func (a API) MaxReconnectAttempts() int { return a.s.maxRecon.Get() }

// AnyHope reports whether some path carries requests or may again
// without the user's help; requests wait for such a path rather than
// fail.
func (c *Session) AnyHope() bool {
	if c.closed.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.paths {
		if PathHasHope(p.state.Load()) {
			return true
		}
	}
	return false
}

// Close stops every path and waits until each has closed its connections
// (Conn.Close). The transport then stops its queues. It reports whether
// this call closed the session (false: it was closed already).
func (c *Session) Close() bool {
	c.mu.Lock()
	if c.closed.Swap(true) {
		c.mu.Unlock()
		return false
	}
	close(c.closing)
	c.cancelStop()
	paths := append([]*Path(nil), c.paths...)
	c.mu.Unlock()
	for _, p := range paths {
		p.wake()
	}
	c.wg.Wait()
	for _, p := range paths {
		p.closeWakeFD()
	}
	return true
}
