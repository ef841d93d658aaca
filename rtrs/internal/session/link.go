package session

import (
	"sync"
	"sync/atomic"

	"github.com/urnbd/urnbd/rtrs"
)

// Link counts a client session's connected paths and reports when the
// session loses the last one and when it gets one back. If it holds IO,
// a path coming back after all were down does not carry the IO queues'
// requests (Held) until the user resumes them (Resume): the user
// re-establishes its state on the server first, as RNBD reopens its
// devices, whose ids a restarted server gives anew.
type Link struct {
	mu      sync.Mutex
	up      int    // paths connected
	everUp  bool   // a path was connected once: the next 0 → 1 is a reconnect
	gen     uint64 // reconnects so far
	hold    bool
	held    atomic.Bool
	onEvent func(ev rtrs.LinkEvent, gen uint64)
}

// NewLink returns a link that calls onEvent (if not nil) on each event,
// with the number of reconnects so far, and holds IO after a reconnect if
// hold is set. onEvent runs on the goroutine of the path that changed: it
// must not block.
func NewLink(hold bool, onEvent func(ev rtrs.LinkEvent, gen uint64)) *Link {
	return &Link{hold: hold, onEvent: onEvent}
}

// Held reports whether IO queues must not send: the session reconnected
// and its user has not resumed it yet.
func (l *Link) Held() bool { return l != nil && l.held.Load() }

// Resume lets IO flow again after reconnect gen; it reports whether IO was
// held (the caller then wakes its queues). A Resume for an older
// reconnect than the last does nothing: the session went down and came
// back since, and its user has to set up again.
func (l *Link) Resume(gen uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen {
		return false
	}
	return l.held.Swap(false)
}

func (l *Link) pathUp() {
	l.mu.Lock()
	l.up++
	reconnected := l.up == 1 && l.everUp
	l.everUp = true
	if reconnected {
		l.gen++
		if l.hold {
			l.held.Store(true)
		}
	}
	gen := l.gen
	l.mu.Unlock()
	if reconnected && l.onEvent != nil {
		l.onEvent(rtrs.LinkReconnected, gen)
	}
}

func (l *Link) pathDown() {
	l.mu.Lock()
	l.up--
	down := l.up == 0
	gen := l.gen
	l.mu.Unlock()
	if down && l.onEvent != nil {
		l.onEvent(rtrs.LinkDisconnected, gen)
	}
}

// PathState is a client path's state (PathState*) that tells its session's
// Link when the path becomes connected and when it stops being so. A path
// counts as up before its state reads connected, so that a held session's
// IO queues see the hold no later than the path.
type PathState struct {
	mu   sync.Mutex
	v    atomic.Int32
	link *Link
}

// Bind makes s report to l; before any Store.
func (s *PathState) Bind(l *Link) { s.link = l }

// Load returns the state.
func (s *PathState) Load() int32 { return s.v.Load() }

// Store sets the state.
func (s *PathState) Store(v int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.v.Load()
	if s.link != nil && v == PathStateConnected && old != PathStateConnected {
		s.link.pathUp()
	}
	s.v.Store(v)
	if s.link != nil && old == PathStateConnected && v != PathStateConnected {
		s.link.pathDown()
	}
}
