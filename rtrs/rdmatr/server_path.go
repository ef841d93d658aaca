package rdmatr

import (
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
)

// closePath closes p in the session layer (no request of p starts any
// more), disconnects its connections, waits for its pollers and in-flight
// requests, and frees its connections. The session layer frees the
// session's pool and registrations when the last request is done with
// them.
func (s *Server) closePath(p *serverPath) {
	if conns, first := s.shutPath(p); first {
		s.freePath(p, conns)
	}
}

// shutPath stops p at once: no request of p starts any more, and its QPs
// are in the error state (rdma_disconnect moves them there before it
// returns), so no RDMA write of the client lands in the chunks after it.
// It returns p's connections and whether this call shut it (then the
// caller frees them with freePath).
func (s *Server) shutPath(p *serverPath) ([]*serverConn, bool) {
	s.tab.ClosePath(p.core)
	s.mu.Lock()
	if p.closed {
		s.mu.Unlock()
		return nil, false
	}
	p.closed = true
	conns := append([]*serverConn(nil), p.conns...)
	s.mu.Unlock()
	for _, sc := range conns {
		if sc == nil {
			continue
		}
		sc.mu.Lock()
		sc.dead = true
		sc.mu.Unlock()
		close(sc.stop)
		if sc.loop != nil {
			sc.loop.mbox.Post(loopMsg{sc: sc}) // the loop lets go of it: sc.wg
		}
		sc.c.id.Disconnect()
	}
	return conns, true
}

// freePath waits for the pollers and in-flight requests of a shut path and
// frees its connections.
func (s *Server) freePath(p *serverPath, conns []*serverConn) {
	for _, sc := range conns {
		if sc != nil {
			sc.wg.Wait()
		}
	}
	for deadline := time.Now().Add(rtrs.ConnectTimeout); p.inflight.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	for _, sc := range conns {
		if sc != nil {
			delete(s.conns, sc.c.id)
			sc.free()
			sc.slot.Close()
		}
	}
	delete(s.paths, p)
	s.mu.Unlock()
}

func (s *Server) heartbeat(p *serverPath) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		s.mu.Lock()
		closed, sc := p.closed, p.conns[0]
		s.mu.Unlock()
		if closed || sc == nil {
			return
		}
		switch m := p.hbMissed.Load(); {
		case int(m) > s.cfg.MissedHeartbeats:
			s.logf("path %v: %d heartbeats missed", sc.local, m)
			go s.closePath(p)
			return
		case m > 0:
			p.hbMissed.Add(1)
		default:
			p.hbMissed.Store(1)
			sc.sendImm(rtrs.HeartbeatImm)
		}
	}
}

// sendImm posts a zero-length RDMA-WRITE-with-IMM (heartbeat or answer).
func (sc *serverConn) sendImm(imm uint32) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.dead {
		return syscall.ENOTCONN
	}
	sc.sb.Add(rdma.SendWR{ID: 0, Opcode: rdma.WRWriteWithImm, Flags: rdma.SendSignaled, Imm: imm})
	_, err := sc.sb.Post(sc.c.qp)
	return err
}
