package rtrs

import (
	"fmt"
	"syscall"
)

// PathAddr names one path of a client session: Dst is the server's
// address, Src optionally the local IP to connect from. The transport
// says what Dst looks like (over TCP "host:port"; over RDMA "ip:port" or
// "ip", port DefaultPort).
type PathAddr struct {
	Src string
	Dst string
}

// String returns "src@dst" or "dst", as RTRS names paths.
func (a PathAddr) String() string {
	if a.Src == "" {
		return a.Dst
	}
	return a.Src + "@" + a.Dst
}

// States of a client path, as the transports report them
// (ClientPathInfo.State holds PathStateName of one).
const (
	PathStateConnecting   int32 = iota // first connect
	PathStateConnected                 // carries requests
	PathStateReconnecting              // failed, reconnecting
	PathStateDisconnected              // disconnected by the user, or reconnecting given up
	PathStateRemoved                   // removed from the session
)

// PathStateName returns "connecting", "connected", "reconnecting",
// "disconnected", "removed", or "unknown" for any other value.
func PathStateName(s int32) string {
	switch s {
	case PathStateConnecting:
		return "connecting"
	case PathStateConnected:
		return "connected"
	case PathStateReconnecting:
		return "reconnecting"
	case PathStateDisconnected:
		return "disconnected"
	case PathStateRemoved:
		return "removed"
	}
	return "unknown"
}

// PathHasHope reports whether a path in state s carries requests or may
// again without the user's help: requests wait for such a path rather
// than fail.
func PathHasHope(s int32) bool {
	switch s {
	case PathStateConnecting, PathStateConnected, PathStateReconnecting:
		return true
	}
	return false
}

// CheckAddPath applies the rules for adding path a to a session that has
// n paths (removed ones included, whose indexes stay taken); live(i)
// returns path i's address and whether it is not removed. A path the
// session has is refused with EEXIST, a path past MaxPathsNum with ENOMEM.
func CheckAddPath(a PathAddr, n int, live func(i int) (PathAddr, bool)) error {
	for i := 0; i < n; i++ {
		if b, ok := live(i); ok && b == a {
			return fmt.Errorf("path %v exists: %w", a, syscall.EEXIST)
		}
	}
	if n >= MaxPathsNum {
		return fmt.Errorf("%d paths already: %w", n, syscall.ENOMEM)
	}
	return nil
}
