package rdmatr

import (
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/chunkgate"
)

func (s *Server) cmLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.quit:
			return
		default:
		}
		ev, err := s.ch.GetEvent()
		if err != nil {
			waitFd(s.ch.Fd(), 100*time.Millisecond)
			continue
		}
		ev.Ack()
		switch ev.Type {
		case rdma.EventConnectRequest:
			s.onConnectRequest(ev)
		case rdma.EventEstablished:
		default:
			s.mu.Lock()
			sc := s.conns[ev.ID]
			s.mu.Unlock()
			if sc != nil {
				s.logf("path %v cid %d: %v (status %d)", sc.local, sc.c.cid, ev.Type, ev.Status)
				go s.closePath(sc.p)
			}
		}
	}
}

func (s *Server) reject(id *rdma.CMID, errno syscall.Errno) {
	rsp := rtrs.ConnRsp{Errno: -int16(errno)}
	var b [rtrs.ConnRspSize]byte
	rsp.MarshalTo(b[:])
	id.Reject(b[:])
	id.Destroy()
}

func (s *Server) pdFor(id *rdma.CMID) (*rdma.PD, error) {
	ctx := id.Context()
	if pd := s.pds[ctx]; pd != nil {
		return pd, nil
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, err
	}
	s.pds[ctx] = pd
	return pd, nil
}

// onConnectRequest admits the connection, applies the session layer's
// checks and accepts or rejects.
func (s *Server) onConnectRequest(ev *rdma.Event) {
	id := ev.ID
	var req rtrs.ConnReq
	if err := req.Unmarshal(ev.PrivateData); err != nil || req.CIDNum > rtrs.MaxConnsPerPath || req.CID >= req.CIDNum {
		s.reject(id, syscall.ECONNRESET)
		return
	}
	src, dst := id.PeerAddr(), id.LocalAddr()
	slot, err := s.tab.Admit(src.Addr())
	if err != nil {
		s.reject(id, rtrs.ErrnoOr(err, syscall.EBUSY))
		return
	}
	// The handshake is this one event: accepted or refused here.
	slot.HandshakeDone()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		slot.Close()
		s.reject(id, syscall.ECONNRESET)
		return
	}
	qd, chunk := s.cfg.QueueDepth, s.cfg.ChunkSize
	core, err := s.tab.Attach(&req, src, dst, qd*chunk, func(cp *rtrs.ServerPath) rtrs.PathOwner {
		return &serverPath{core: cp, cidNum: cp.CIDNum(), conns: make([]*serverConn, cp.CIDNum()),
			ios: make([]ServerIO, qd), stats: rtrs.NewServerPathStats(0), fence: req.Fence}
	})
	if err != nil {
		slot.Close()
		s.logf("connection from %v refused: %v", src, err)
		s.reject(id, rtrs.ErrnoOr(err, syscall.ECONNRESET))
		return
	}
	p := core.Owner().(*serverPath)
	if p.sess == nil {
		p.sess = s.session(core.Session())
		s.paths[p] = struct{}{}
	}
	sc, err := s.newServerConn(p, id, req.CID)
	if err != nil {
		slot.Close()
		s.logf("path %v cid %d: %v", id.LocalAddr(), req.CID, err)
		// A no-op if the failure already destroyed the id with the
		// connection's resources: then the peer's connect times out.
		s.reject(id, syscall.ENOMEM)
		go s.closePath(p)
		return
	}
	sc.slot = slot
	p.conns[req.CID] = sc
	s.conns[id] = sc
	rsp := rtrs.ConnRsp{QueueDepth: uint16(qd), MaxIOSize: uint32(chunk - s.cfg.MaxHdrSize), MaxHdrSize: uint32(s.cfg.MaxHdrSize)}
	if p.fence {
		rsp.Flags |= rtrs.FlagFence
	}
	var b [rtrs.ConnRspSize]byte
	rsp.MarshalTo(b[:])
	if err := id.Accept(rdma.ConnParam{PrivateData: b[:], RNRRetryCount: 7}); err != nil {
		go s.closePath(p)
		return
	}
	sc.wg.Add(1)
	sc.loop.mbox.Post(loopMsg{sc: sc, add: true})
}

// ClosePath implements rtrs.PathOwner.
func (p *serverPath) ClosePath() { go p.sess.s.closePath(p) }

// session returns the RDMA side of a session, made on its first path;
// s.mu is held. The session layer frees it: its registrations go when no
// request holds the pool any more.
func (s *Server) session(core *rtrs.ServerSession) *serverSession {
	if ss := s.sess[core]; ss != nil {
		return ss
	}
	ss := &serverSession{s: s, core: core, chunks: core.Pool(), gate: chunkgate.New[*ServerIO](s.cfg.QueueDepth),
		mrs: map[rdma.Context]*rdma.MR{}}
	s.sess[core] = ss
	core.OnFree(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, mr := range ss.mrs {
			mr.Dereg()
		}
		ss.mrs = nil
		delete(s.sess, core)
	})
	return ss
}

// newServerConn creates the connection's verbs resources, registers the
// session's chunk pool on its device if not yet, and posts its receives:
// on cid 0 first the INFO_REQ buffer, then empty-payload slots.
func (s *Server) newServerConn(p *serverPath, id *rdma.CMID, cid uint16) (*serverConn, error) {
	pd, err := s.pdFor(id)
	if err != nil {
		return nil, err
	}
	ss := p.sess
	mr := ss.mrs[id.Context()]
	if mr == nil {
		if mr, err = pd.RegMR(ss.chunks, rdma.AccessLocalWrite|rdma.AccessRemoteWrite); err != nil {
			return nil, err
		}
		ss.mrs[id.Context()] = mr
	}
	qd := s.cfg.QueueDepth
	nrecv := qd + 1
	if cid == 0 {
		nrecv = max(qd, rtrs.ServiceConQueueDepth) + 1
	}
	extra := rtrs.InfoReqSize + rtrs.InfoRspHdrSize + rtrs.SGDescSize
	c, err := newConn(id, pd, cid, 3*qd+2, nrecv, extra, false)
	if err != nil {
		return nil, err
	}
	sc := &serverConn{p: p, c: c, mr: mr, local: id.LocalAddr(), stop: make(chan struct{}), loop: s.loopOf(cid),
		sb: rdma.NewSendBatch(serverSendBatch, 2), rb: rdma.NewRecvBatch(c.nrecv, 1)}
	if cid == 0 {
		// The INFO_REQ lands in the extra area.
		err := sc.rb.Add(infoRecvID, c.rmr.SGE(c.extraOff(), rtrs.InfoReqSize))
		if err == nil {
			_, err = sc.rb.Post(c.qp)
		}
		if err != nil {
			sc.free()
			return nil, err
		}
	}
	if err := c.postRecvs(0, c.nrecv-1); err != nil {
		sc.free()
		return nil, err
	}
	return sc, nil
}

const infoRecvID = 1 << 40

// serverSendBatch is how many work requests a connection gathers before
// posting: the answers of a whole poll batch (pollBatch completions, up to
// two work requests each).
const (
	pollBatch       = 32
	serverSendBatch = 2*pollBatch + 4
)

func (sc *serverConn) free() {
	sc.c.destroy(false)
	sc.sb.Free()
	sc.rb.Free()
}
