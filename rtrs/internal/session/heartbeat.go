package session

import (
	"sync/atomic"
	"time"
)

// heartbeat is the heartbeat rule of a path's service loop: a heartbeat
// every interval, and the path failed once more than MissedHeartbeats
// intervals have passed with nothing received on it.
type heartbeat struct {
	interval time.Duration
	next     time.Time    // service loop only
	missed   atomic.Int32 // intervals since something was received
	sentAt   atomic.Int64 // UnixNano of the last heartbeat sent
}

func (h *heartbeat) reset(interval time.Duration) {
	h.interval = interval
	h.next = time.Now() // the first one at once: it measures the RTT
	h.missed.Store(0)
	h.sentAt.Store(0)
}

// NextHeartbeat returns when the service loop must call HeartbeatDue
// next; service loop only.
func (p *Path) NextHeartbeat() time.Time { return p.hb.next }

// HeartbeatDue is called by the service loop when it wakes: it reports
// whether a heartbeat is due now (the loop sends it) and fails the path
// if too many intervals passed in silence. Service loop only.
func (p *Path) HeartbeatDue(now time.Time) bool {
	h := &p.hb
	if now.Before(h.next) {
		return false
	}
	h.next = now.Add(h.interval)
	// The (MissedHeartbeats+1)th tick since anything came: more than
	// MissedHeartbeats intervals of silence.
	if m := h.missed.Add(1); int(m) > p.c.cfg.MissedHeartbeats {
		p.Failed(p.serving.Load(), "nothing received for %d heartbeat intervals", m-1)
		return false
	}
	h.sentAt.Store(now.UnixNano())
	return true
}

// Alive records that something arrived on the path (any thread). The
// queues call it per completion: it writes the shared counter only when
// it is not 0 already, so that the queues' threads do not pass its cache
// line between their CPUs on every I/O.
func (p *Path) Alive() {
	if p.hb.missed.Load() != 0 {
		p.hb.missed.Store(0)
	}
}

// HeartbeatAcked records a heartbeat's answer: the round trip (the
// kernel's cur_latency, from the last heartbeat sent) and life.
func (p *Path) HeartbeatAcked() {
	p.Alive()
	if at := p.hb.sentAt.Load(); at != 0 {
		p.rtt.Store(time.Now().UnixNano() - at)
	}
}
