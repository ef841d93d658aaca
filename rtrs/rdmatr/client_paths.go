package rdmatr

import (
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
)

// Run-time path management, as the kernel client's sysfs files add_path,
// remove_path, disconnect, reconnect and max_reconnect_attempts. A path
// that goes away (removed, disconnected, or reconnected anew) takes its
// connections from the queues, whose requests on it fail over to the
// other paths exactly as when a path fails; with no path left that may
// come back, waiting requests fail with -ENOTCONN.

// User commands to a path goroutine (clientPath.cmd); the latest wins,
// but a removal stays.
const (
	cmdNone int32 = iota
	cmdReconnect
	cmdDisconnect
	cmdRemove
)

// AddPath adds a path to the live session and connects it in the
// background; it returns the path's index (in Paths and for the other
// path methods). The path must not be one of the session's (EEXIST), and
// a session has at most rtrs.MaxPathsNum paths, removed ones included.
func (c *Client) AddPath(a PathAddr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return 0, fmt.Errorf("rtrs/rdmatr client: add path %v: %w", a, net.ErrClosed)
	}
	if err := rtrs.CheckAddPath(a, len(c.paths), c.livePath); err != nil {
		return 0, fmt.Errorf("rtrs/rdmatr client: %w", err)
	}
	p, err := c.newPath(len(c.paths), a)
	if err != nil {
		return 0, fmt.Errorf("rtrs/rdmatr client: add path %v: %w", a, err)
	}
	c.paths = append(c.paths, p)
	c.wg.Add(1) // under c.mu, so Close (which takes it) waits for this path too
	go p.run()
	return p.idx, nil
}

// livePath returns path i's address and whether it is not removed; c.mu
// is held.
func (c *Client) livePath(i int) (PathAddr, bool) {
	p := c.paths[i]
	return p.addr, p.state.Load() != PathStateRemoved
}

// RemovePath disconnects path idx and removes it from the session; its
// requests fail over. The index stays taken (state "removed").
func (c *Client) RemovePath(idx int) error { return c.pathCmd(idx, cmdRemove) }

// DisconnectPath disconnects path idx and keeps it, disconnected, until
// ReconnectPath; its requests fail over.
func (c *Client) DisconnectPath(idx int) error { return c.pathCmd(idx, cmdDisconnect) }

// ReconnectPath disconnects path idx if it is connected and connects it
// again at once, with a fresh count of reconnect attempts; it also brings
// back a path that was disconnected or had given up.
func (c *Client) ReconnectPath(idx int) error { return c.pathCmd(idx, cmdReconnect) }

// SetMaxReconnectAttempts changes max_reconnect_attempts for every path:
// how many failed reconnects in a row a path makes before it stays
// disconnected (-1: forever, 0: none). It applies from the next attempt;
// a path that already gave up waits for ReconnectPath.
func (c *Client) SetMaxReconnectAttempts(n int) error {
	if err := c.maxRecon.Set(n); err != nil {
		return fmt.Errorf("rtrs/rdmatr client: %w", err)
	}
	return nil
}

// MaxReconnectAttempts returns the current max_reconnect_attempts.
func (c *Client) MaxReconnectAttempts() int { return c.maxRecon.Get() }

func (c *Client) pathCmd(idx int, cmd int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("rtrs/rdmatr client: path %d: %w", idx, net.ErrClosed)
	}
	if idx < 0 || idx >= len(c.paths) || c.paths[idx].state.Load() == PathStateRemoved {
		return fmt.Errorf("rtrs/rdmatr client: no path %d: %w", idx, syscall.ENOENT)
	}
	c.paths[idx].command(cmd)
	return nil
}

// command records a user command for the path goroutine and wakes it.
func (p *clientPath) command(cmd int32) {
	for {
		old := p.cmd.Load()
		if old == cmdRemove || p.cmd.CompareAndSwap(old, cmd) {
			break
		}
	}
	p.wake()
}

// takeCmd returns and clears the pending command.
func (p *clientPath) takeCmd() int32 { return p.cmd.Swap(cmdNone) }

// settle puts the path in a state without hope (disconnected, removed)
// and wakes the queues, whose waiting requests fail if no path is left.
func (p *clientPath) settle(state int32) {
	p.state.Store(state)
	p.c.wakeQueues()
}

// parked keeps the path disconnected until the user reconnects it (true)
// or removes it, or the client closes (false).
func (p *clientPath) parked() bool {
	p.settle(PathStateDisconnected)
	for !p.c.closed.Load() {
		switch p.takeCmd() {
		case cmdReconnect:
			return true
		case cmdRemove:
			p.settle(PathStateRemoved)
			return false
		}
		waitFd(p.wakeFD, time.Minute)
		var b [8]byte
		unix.Read(p.wakeFD, b[:])
	}
	return false
}

// wakeQueues has every queue retry its waiting requests: a path came or
// went, or lost hope.
func (c *Client) wakeQueues() {
	c.mu.Lock()
	qs := c.queues
	c.mu.Unlock()
	for _, q := range qs {
		q.post(qmsg{kind: msgRetry})
	}
}
