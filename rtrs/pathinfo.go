package rtrs

import (
	"sync/atomic"
	"time"
)

// ClientPathInfo is a snapshot of a client path, as the Paths method of
// both transports' clients returns it.
type ClientPathInfo struct {
	Index int
	Addr  PathAddr
	State string
	RTT   time.Duration
	// LastError is why the path's last connect attempt failed; empty
	// once one succeeds. A path that keeps "connecting" says why here.
	LastError string
	// Stats are the path's statistics (live, not a copy).
	Stats *ClientPathStats
}

// ConnectError holds the reason of a path's last failed connect attempt.
// It is safe for concurrent use.
type ConnectError struct{ p atomic.Pointer[string] }

// Set records err, or clears the reason when err is nil.
func (e *ConnectError) Set(err error) {
	if err == nil {
		e.p.Store(nil)
		return
	}
	s := err.Error()
	e.p.Store(&s)
}

// String returns the recorded reason, or "".
func (e *ConnectError) String() string {
	if p := e.p.Load(); p != nil {
		return *p
	}
	return ""
}
