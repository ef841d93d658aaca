package rnbd

import (
	"fmt"
	"syscall"

	"github.com/urnbd/urnbd/rtrs"
)

// PathOp is a run-time operation on one path of a session: the kernel's
// per-path sysfs files remove_path, disconnect and reconnect.
type PathOp int

const (
	PathRemove PathOp = iota
	PathDisconnect
	PathReconnect
)

func (op PathOp) String() string {
	switch op {
	case PathRemove:
		return "remove"
	case PathDisconnect:
		return "disconnect"
	case PathReconnect:
		return "reconnect"
	}
	return fmt.Sprintf("PathOp(%d)", int(op))
}

// AddPath adds a path to the session (the kernel's add_path): src may be
// empty, dst is "host:port". It returns the new path's index; the path
// connects in the background, its state shows in Paths.
func (c *Client) AddPath(src, dst string) (int, error) {
	return c.t.pathManager().AddPath(rtrs.PathAddr{Src: src, Dst: dst})
}

// PathOp removes, disconnects or reconnects path idx. In-flight requests
// of a path that goes away fail over to the session's other paths.
func (c *Client) PathOp(idx int, op PathOp) error {
	pm := c.t.pathManager()
	switch op {
	case PathRemove:
		return pm.RemovePath(idx)
	case PathDisconnect:
		return pm.DisconnectPath(idx)
	case PathReconnect:
		return pm.ReconnectPath(idx)
	}
	return fmt.Errorf("rnbd: path operation %v: %w", op, syscall.EINVAL)
}

// SetPolicy sets the session's multipath policy (mpath_policy).
func (c *Client) SetPolicy(p rtrs.MPPolicy) { c.t.pathManager().SetPolicy(p) }

// SetMaxReconnectAttempts bounds the reconnects of a failed path
// (max_reconnect_attempts; -1: forever).
func (c *Client) SetMaxReconnectAttempts(n int) error {
	return c.t.pathManager().SetMaxReconnectAttempts(n)
}
