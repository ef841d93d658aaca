package session

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// The client side of fencing (rtrs.FlagFence). When a path goes down
// while the server fences, the requests it carried are held back by the
// queues until the server is known to have closed it: through another
// connected path, which sends a FenceReq for it on its service
// connection, or by the path's own next connect (the server takes a
// path's sess_uuid again only once its old connections are gone).

// fenceRetry is how often a path that went down tries again to have the
// server fence it through another path.
const fenceRetry = 50 * time.Millisecond

// fenceCall is a fence request handed to another path's service loop.
type fenceCall struct {
	target rtrs.UUID
	done   chan error // buffered: the loop never blocks on it
}

// fenceLoop has the server close connect gen of p, through another
// connected path. It ends when that is done, when p connected again
// (which fences it too) or when the session closes.
func (p *Path) fenceLoop(gen uint64) {
	c := p.c
	defer c.wg.Done()
	for p.fencedGen.Load() < gen && !c.closed.Load() {
		var others []*Path
		c.EachPath(func(o *Path) {
			if o != p && o.state.Load() == PathStateConnected {
				others = append(others, o)
			}
		})
		for _, o := range others {
			if o.fence(p.sessUUID) == nil {
				p.markFenced(gen)
				return
			}
		}
		select {
		case <-c.closing:
			return
		case <-time.After(fenceRetry):
		}
	}
}

// fence asks the server, on p's service connection, to close the path
// target, and waits for the answer.
func (p *Path) fence(target rtrs.UUID) error {
	c := p.c
	fc := &fenceCall{target: target, done: make(chan error, 1)}
	p.fenceMu.Lock()
	p.fenceQ = append(p.fenceQ, fc)
	p.fenceMu.Unlock()
	p.wake()
	timeout := time.NewTimer(c.cfg.HeartbeatInterval * time.Duration(c.cfg.MissedHeartbeats+1))
	defer timeout.Stop()
	select {
	case err := <-fc.done:
		return err
	case <-timeout.C:
		if p.dropFence(fc) {
			// Sent and not answered: answers name no fence (over RDMA
			// they are an immediate), so a late one must not be taken
			// for the next. The connection is reset instead, as one
			// whose heartbeats go unanswered.
			p.Failed(p.serving.Load(), "a fence was not answered within %v", c.cfg.HeartbeatInterval*time.Duration(c.cfg.MissedHeartbeats+1))
		}
		return fmt.Errorf("fence of path %v: %w", target, syscall.ETIMEDOUT)
	case <-c.closing:
		return syscall.ENOTCONN
	}
}

// dropFence takes a fence nobody waits for any more out of the queue;
// it reports whether the fence was sent already.
func (p *Path) dropFence(fc *fenceCall) (sent bool) {
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	for i, q := range p.fenceQ {
		if q == fc {
			p.fenceQ = append(p.fenceQ[:i], p.fenceQ[i+1:]...)
			return false
		}
	}
	return p.fenceOut == fc
}

// NextFence returns the path whose fence the service loop must send now,
// if any: one at a time, the next once FenceAnswered is called. Service
// loop only.
func (p *Path) NextFence() (rtrs.UUID, bool) {
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	if p.fenceOut != nil || len(p.fenceQ) == 0 {
		return rtrs.UUID{}, false
	}
	p.fenceOut = p.fenceQ[0]
	p.fenceQ = p.fenceQ[1:]
	return p.fenceOut.target, true
}

// FenceAnswered hands the server's answer to the fence sent last (errno
// 0 or a positive errno). Service loop only.
func (p *Path) FenceAnswered(errno int) {
	p.fenceMu.Lock()
	fc := p.fenceOut
	p.fenceOut = nil
	p.fenceMu.Unlock()
	if fc == nil {
		return // more answers than fences: not ours to block on
	}
	if errno != 0 {
		fc.done <- fmt.Errorf("fence refused: %w", syscall.Errno(errno))
		return
	}
	fc.done <- nil
}

// failFences fails the fences sent or queued on p once its service
// connection is gone.
func (p *Path) failFences() {
	err := fmt.Errorf("path %v went down before the fence was answered: %w", p.addr, syscall.ENOTCONN)
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	if p.fenceOut != nil {
		p.fenceOut.done <- err
		p.fenceOut = nil
	}
	for _, fc := range p.fenceQ {
		fc.done <- err
	}
	p.fenceQ = nil
}

// markFenced records that the server has closed p's connects up to gen and
// lets the queues resend what those carried.
func (p *Path) markFenced(gen uint64) {
	if p.fencedGen.Advance(gen) { // gen ≥ 1: after a connect, so after Start
		p.c.tr.Fenced(p, gen)
	}
}

// FencedGen is the newest connect of a client path (the transport numbers
// them) that the server is known to have closed: the requests of that
// connect, or an older one, may go again.
type FencedGen struct{ v atomic.Uint64 }

// Load returns the generation.
func (f *FencedGen) Load() uint64 { return f.v.Load() }

// Advance raises the generation to gen and reports whether it moved.
func (f *FencedGen) Advance(gen uint64) bool {
	for {
		old := f.v.Load()
		if gen <= old {
			return false
		}
		if f.v.CompareAndSwap(old, gen) {
			return true
		}
	}
}
