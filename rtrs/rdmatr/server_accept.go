package rdmatr

import (
	"fmt"
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

// infoReqRecvSize is the receive for the INFO_REQ: room for its
// authentication trailer.
const infoReqRecvSize = rtrs.InfoReqSize + rtrs.InfoReqAuthSize

func (s *Server) reject(id *rdma.CMID, errno syscall.Errno) {
	rsp := rtrs.ConnRsp{Errno: -int16(errno)}
	var b [rtrs.ConnRspSize]byte
	rsp.MarshalTo(b[:])
	id.Reject(b[:])
	id.Destroy()
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
	core.AddAuth(&rsp, req.CID)
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

// PathDetails implements rtrs.PathDetailer: the device and port of the
// path's first connection (all of a path's connections share its
// addresses, so its device), and the path's counters.
func (p *serverPath) PathDetails() rtrs.PathDetails {
	d := rtrs.PathDetails{Transport: "rdma", Stats: p.stats}
	s := p.sess.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sc := range p.conns {
		if sc != nil && sc.c != nil && sc.c.id != nil {
			d.HCAName, d.HCAPort = sc.c.id.DeviceName(), sc.c.id.PortNum()
			break
		}
	}
	return d
}

// session returns the RDMA side of a session, made on its first path;
// s.mu is held. The session layer frees it: its registrations go when no
// request holds the pool any more.
func (s *Server) session(core *rtrs.ServerSession) *serverSession {
	if ss := s.sess[core]; ss != nil {
		return ss
	}
	ss := &serverSession{s: s, core: core, chunks: core.Pool(), gate: chunkgate.New[*ServerIO](s.cfg.QueueDepth),
		devs: map[rdma.Context]*sessionPD{}}
	s.sess[core] = ss
	core.OnFree(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, d := range ss.devs {
			d.mr.Dereg()
			d.mr = nil
			d.release()
		}
		ss.devs = nil
		delete(s.sess, core)
	})
	return ss
}

// pdOn returns the session's protection domain on the device of id, made
// with the registration of its pool on the first connection there;
// Server.mu is held.
func (ss *serverSession) pdOn(id *rdma.CMID) (*sessionPD, error) {
	ctx := id.Context()
	if d := ss.devs[ctx]; d != nil {
		return d, nil
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("allocate the session's protection domain: %w", err)
	}
	mr, err := pd.RegMR(ss.chunks, rdma.AccessLocalWrite|rdma.AccessRemoteWrite)
	if err != nil {
		pd.Dealloc()
		return nil, fmt.Errorf("register the session's chunks: %w", err)
	}
	d := &sessionPD{pd: pd, mr: mr, refs: 1}
	ss.devs[ctx] = d
	return d, nil
}

// newServerConn creates the connection's verbs resources in the session's
// protection domain on its device (made, with the registration of the
// session's chunk pool, if not yet), and posts its receives: on cid 0
// first the INFO_REQ buffer, then empty-payload slots. Server.mu is held.
func (s *Server) newServerConn(p *serverPath, id *rdma.CMID, cid uint16) (*serverConn, error) {
	d, err := p.sess.pdOn(id)
	if err != nil {
		return nil, err
	}
	qd := s.cfg.QueueDepth
	nrecv := qd + 1
	if cid == 0 {
		nrecv = max(qd, rtrs.ServiceConQueueDepth) + 1
	}
	extra := infoReqRecvSize + rtrs.InfoRspHdrSize + rtrs.SGDescSize + rtrs.InfoRspAuthSize
	c, err := newConn(id, d.pd, cid, 3*qd+2, nrecv, extra, false)
	if err != nil {
		return nil, err
	}
	d.refs++
	sc := &serverConn{p: p, c: c, pd: d, mr: d.mr, local: id.LocalAddr(), stop: make(chan struct{}), loop: s.loopOf(cid),
		sb: rdma.NewSendBatch(serverSendBatch, 2), rb: rdma.NewRecvBatch(c.nrecv, 1)}
	if cid == 0 {
		// The INFO_REQ lands in the extra area.
		err := sc.rb.Add(infoRecvID, c.rmr.SGE(c.extraOff(), infoReqRecvSize))
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

// free frees the connection's resources, its QP first, then its hold on
// the session's protection domain; Server.mu is held.
func (sc *serverConn) free() {
	sc.c.destroy(false)
	if sc.pd != nil {
		sc.pd.release()
		sc.pd = nil
	}
	sc.sb.Free()
	sc.rb.Free()
}
