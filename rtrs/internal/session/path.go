package session

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
)

// Path is one path of a session, run by a goroutine of its own (run).
// Its methods may be called from any goroutine unless they say otherwise.
type Path struct {
	c        *Session
	idx      int
	addr     rtrs.PathAddr
	sessUUID rtrs.UUID
	initial  bool // one of the session's paths at New (not AddPath)
	state    PathState
	stats    *rtrs.ClientPathStats
	connErr  rtrs.ConnectError // why the last connect attempt failed
	rtt      atomic.Int64      // ns, the last heartbeat round trip
	first    chan error        // the first attempt's outcome, once

	// Path goroutine only.
	attempt  int    // connect attempts made
	everUp   bool   // connected once
	reconCnt uint16 // recon_cnt of the current attempt
	gen      uint64 // connects made: the current one's number

	// serving is the gen of the connect being served, 0 when none;
	// failed is set when that connect failed (Failed).
	serving atomic.Uint64
	failed  atomic.Bool
	cmd     atomic.Int32 // the user's pending command (cmdNone, ...)

	wakeC  chan struct{} // capacity 1: wake-ups for the path goroutine
	wakeMu sync.Mutex
	wakeFD int // eventfd for transports that poll (WakeFD), or -1

	hb heartbeat

	// fencedGen is the newest connect of the path that the server is
	// known to have closed: the queues resend the requests of that
	// connect or an older one only then (rtrs.Unfenced).
	fencedGen FencedGen
	fenceMu   sync.Mutex
	fenceQ    []*fenceCall // fences of other paths, for this path's service loop to send
	fenceOut  *fenceCall   // sent on this path, not answered yet
}

// User commands to a path (Path.cmd); the latest wins, but a removal stays.
const (
	cmdNone int32 = iota
	cmdReconnect
	cmdDisconnect
	cmdRemove
)

func (c *Session) newPath(idx int, a rtrs.PathAddr, initial bool) *Path {
	p := &Path{c: c, idx: idx, addr: a, initial: initial, stats: rtrs.NewClientPathStats(0),
		first: make(chan error, 1), wakeC: make(chan struct{}, 1), wakeFD: -1}
	_, _ = rand.Read(p.sessUUID[:])
	p.state.Bind(c.link)
	p.state.Store(PathStateConnecting)
	return p
}

// Session returns the path's session.
func (p *Path) Session() *Session { return p.c }

// Index returns the path's index in its session.
func (p *Path) Index() int { return p.idx }

// Addr returns the path's addresses.
func (p *Path) Addr() rtrs.PathAddr { return p.addr }

// SessUUID returns the path's uuid (rtrs.ConnReq.SessUUID).
func (p *Path) SessUUID() rtrs.UUID { return p.sessUUID }

// Stats returns the path's statistics.
func (p *Path) Stats() *rtrs.ClientPathStats { return p.stats }

// State returns the path's state (PathState*).
func (p *Path) State() int32 { return p.state.Load() }

// FencedGen returns the newest connect of the path that the server has
// closed for sure (see Transport.Fenced).
func (p *Path) FencedGen() uint64 { return p.fencedGen.Load() }

// Usable, Inflight and Latency implement rtrs.PathLoad.
func (p *Path) Usable() bool    { return p.state.Load() == PathStateConnected }
func (p *Path) Inflight() int64 { return p.stats.Inflight() }
func (p *Path) Latency() int64  { return p.rtt.Load() }

// ConnReq returns the ConnReq of connection cid of the current connect
// attempt; path goroutine only (in Transport.Connect).
func (p *Path) ConnReq(cid int) rtrs.ConnReq {
	return rtrs.ConnReq{
		CID: uint16(cid), CIDNum: uint16(p.c.cfg.CIDNum()), ReconCnt: p.reconCnt,
		SessUUID: p.sessUUID, PathsUUID: p.c.pathsUUID,
		FirstConn: p.initial || p.everUp, Fence: true,
	}
}

// Failed reports that connect gen of the path failed (a queue saw its
// connection fail, or the service loop did): the path goroutine takes it
// down and reconnects. A report for a connect no longer served is
// dropped. why and args are logged (Config().Logf) once per connect.
func (p *Path) Failed(gen uint64, why string, args ...any) {
	if gen == 0 || p.serving.Load() != gen || p.failed.Swap(true) {
		return
	}
	if !p.c.closed.Load() {
		p.c.Logf("rtrs client path %v: "+why, append([]any{p.addr}, args...)...)
	}
	p.wake()
}

// Stopping reports whether the service loop must return: the connect
// failed, a user command waits, or the session is closing.
func (p *Path) Stopping() bool {
	return p.failed.Load() || p.cmd.Load() != cmdNone || p.c.closed.Load()
}

// Wakeups returns a channel that receives when the path goroutine has
// something to look at (Stopping, NextFence); for service loops that
// select.
func (p *Path) Wakeups() <-chan struct{} { return p.wakeC }

// WakeFD returns an eventfd that becomes readable on the same wake-ups,
// for service loops that poll; the loop reads it to clear it. It lives
// as long as the session.
func (p *Path) WakeFD() (int, error) {
	p.wakeMu.Lock()
	defer p.wakeMu.Unlock()
	if p.wakeFD < 0 {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("eventfd: %w", err)
		}
		p.wakeFD = fd
	}
	return p.wakeFD, nil
}

func (p *Path) wake() {
	select {
	case p.wakeC <- struct{}{}:
	default:
	}
	p.wakeMu.Lock()
	if p.wakeFD >= 0 {
		one := [8]byte{1}
		_, _ = unix.Write(p.wakeFD, one[:])
	}
	p.wakeMu.Unlock()
}

func (p *Path) closeWakeFD() {
	p.wakeMu.Lock()
	if p.wakeFD >= 0 {
		unix.Close(p.wakeFD)
		p.wakeFD = -1
	}
	p.wakeMu.Unlock()
}

func (p *Path) command(cmd int32) {
	for {
		old := p.cmd.Load()
		if old == cmdRemove || p.cmd.CompareAndSwap(old, cmd) {
			break
		}
	}
	p.wake()
}

func (p *Path) takeCmd() int32 { return p.cmd.Swap(cmdNone) }

// settle puts the path in a state and wakes the queues, whose waiting
// requests fail if no path is left with hope.
func (p *Path) settle(state int32) {
	p.state.Store(state)
	p.c.wakeQueues()
}

// reportFirst hands the first attempt's outcome to Dial, once.
func (p *Path) reportFirst(err error) {
	select {
	case p.first <- err:
	default:
	}
}

// run connects the path, serves it, reconnects it after failures (up to
// max_reconnect_attempts failed attempts in a row, then it stays
// disconnected) and follows the user's commands, until the path is
// removed or the session closes.
func (p *Path) run() {
	c := p.c
	defer c.wg.Done()
	defer p.reportFirst(errors.New("session closed or path removed"))
	failures, lastErr := 0, ""
	for !c.closed.Load() {
		switch p.takeCmd() {
		case cmdRemove:
			p.settle(PathStateRemoved)
			return
		case cmdDisconnect:
			if !p.park() {
				return
			}
			failures = 0
		case cmdReconnect:
			failures = 0
		}
		conn, gen, err := p.connect()
		p.connErr.Set(err)
		if err != nil {
			p.reportFirst(err)
			failures++
			if p.attempt > 1 {
				p.stats.ReconnectFailed()
			}
			if err.Error() != lastErr {
				lastErr = err.Error() // a new reason, not every retry
				c.Logf("rtrs client path %v: connect attempt %d: %v", p.addr, p.attempt, err)
			}
			if errors.Is(err, errParamsChanged) || c.maxRecon.Reached(failures) {
				c.Logf("rtrs client path %v: giving up after %d failed attempts: %v", p.addr, failures, err)
				if !p.park() {
					return
				}
				failures = 0
				continue
			}
			if p.everUp {
				p.state.Store(PathStateReconnecting)
			}
			p.sleep()
			continue
		}
		failures, lastErr = 0, ""
		p.serve(conn, gen)
		if c.closed.Load() {
			break
		}
		if p.cmd.Load() != cmdNone {
			continue // handled at the top; a reconnect goes at once, as the kernel's
		}
		if c.maxRecon.Reached(0) {
			if !p.park() {
				return
			}
			continue
		}
		p.sleep()
	}
	p.state.Store(PathStateDisconnected)
}

// connect makes one connect attempt, checks the session parameters and
// hands the connections to the queues; it returns the connect's number.
func (p *Path) connect() (Conn, uint64, error) {
	c := p.c
	p.attempt++
	p.reconCnt++
	ctx, cancel := context.WithTimeout(c.stop, c.cfg.Timeout) // Close ends it too
	defer cancel()
	conn, err := c.tr.Connect(ctx, p)
	if err != nil {
		return nil, 0, err
	}
	if err := c.start(conn.Params()); err != nil {
		conn.Close()
		return nil, 0, err
	}
	p.gen++
	// Failures the queues report from here on are this connect's.
	p.failed.Store(false)
	p.serving.Store(p.gen)
	if err := conn.Attach(p.gen); err != nil {
		p.serving.Store(0)
		conn.Close()
		return nil, 0, fmt.Errorf("attach: %w", err)
	}
	return conn, p.gen, nil
}

// serve runs connect gen of the path, attached, until it fails or a
// command or Close stops it, and takes it down.
func (p *Path) serve(conn Conn, gen uint64) {
	c := p.c
	p.stats.ReconnectSucceeded() // the count starts at -1: the first connect makes it 0
	p.everUp = true
	// The server took this connect: it has closed the path's earlier
	// ones (it takes a path's sess_uuid again only then), so their
	// requests may go again.
	p.markFenced(gen - 1)
	p.hb.reset(c.cfg.HeartbeatInterval)
	p.state.Store(PathStateConnected)
	p.reportFirst(nil)
	c.wakeQueues()
	conn.Serve(p)
	p.serving.Store(0)
	p.state.Store(PathStateReconnecting)
	conn.Close()
	p.failFences()
	if c.Fencing() && !c.closed.Load() {
		c.wg.Add(1)
		go p.fenceLoop(gen)
	}
	c.wakeQueues()
}

// sleep waits ReconnectDelay plus 0..7 ms of jitter before an attempt; a
// user command or Close cuts it short.
func (p *Path) sleep() {
	d := p.c.cfg.ReconnectDelay + time.Duration(mrand.Int64N(int64(rtrs.ReconnectSeed/time.Millisecond)))*time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	for !p.c.closed.Load() && p.cmd.Load() == cmdNone {
		select {
		case <-t.C:
			return
		case <-p.wakeC:
		}
	}
}

// park keeps the path disconnected until the user reconnects it (true) or
// removes it, or the session closes (false).
func (p *Path) park() bool {
	p.settle(PathStateDisconnected)
	for !p.c.closed.Load() {
		switch p.takeCmd() {
		case cmdReconnect:
			return true
		case cmdRemove:
			p.settle(PathStateRemoved)
			return false
		}
		<-p.wakeC
	}
	return false
}
