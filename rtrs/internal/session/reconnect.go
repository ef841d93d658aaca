package session

import (
	"sync/atomic"

	"github.com/urnbd/urnbd/rtrs"
)

// ReconnectLimit is a client session's max_reconnect_attempts: how many
// failed reconnects in a row a path makes before it gives up and stays
// disconnected (-1: no limit, 0: none). Both transports read it before
// each attempt, so a change at run time applies from the next one. Its
// methods may be called from any goroutine; the zero value means 0.
type ReconnectLimit struct{ n atomic.Int32 }

// Set changes the limit; it must be -1..MaxReconnectAttemptsLimit
// (CheckMaxReconnectAttempts), as the kernel's sysfs file.
func (l *ReconnectLimit) Set(n int) error {
	if err := rtrs.CheckMaxReconnectAttempts(n); err != nil {
		return err
	}
	l.n.Store(int32(n))
	return nil
}

// Get returns the limit.
func (l *ReconnectLimit) Get() int { return int(l.n.Load()) }

// Reached reports whether a path that has failed this many reconnects in
// a row must give up.
func (l *ReconnectLimit) Reached(failed int) bool {
	max := l.Get()
	return max >= 0 && failed >= max
}
