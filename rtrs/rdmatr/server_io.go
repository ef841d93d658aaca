package rdmatr

import (
	"errors"
	"syscall"
	"unsafe"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
)

// setPolling marks the start or the end of a batch of completions; at the
// end it posts the answers gathered during the batch.
func (sc *serverConn) setPolling(on bool) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.polling = on
	if on || sc.dead || sc.sb.Len() == 0 {
		return nil
	}
	if _, err := sc.sb.Post(sc.c.qp); err != nil {
		sc.sb.Reset()
		return err
	}
	return nil
}

func (sc *serverConn) isDead() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.dead
}

// closeFor logs err and closes the connection's path, off the loop's
// thread: closing waits for the loop to let go of the path's connections.
func (sc *serverConn) closeFor(err error) {
	s := sc.p.sess.s
	s.logf("path %v cid %d: %v", sc.local, sc.c.cid, err)
	go s.closePath(sc.p)
}

// stopped reports whether the connection's path was shut.
func (sc *serverConn) stopped() bool {
	select {
	case <-sc.stop:
		return true
	default:
		return false
	}
}

// serveBatch handles a wake-up of the connection's completion channel on
// its loop's thread: it re-arms the CQ (taking the event first where the
// next wait does not read it: conn.armWait) and polls it empty, serving
// each request, then re-posts the receives. The answers go out at the end
// of the loop's batch (serverLoop.endBatch), with one ibv_post_send. It
// returns false when the connection must not be polled again: its path is
// shut, or closing (it started that).
func (sc *serverConn) serveBatch() bool {
	s := sc.p.sess.s
	if err := sc.c.rearm(); err != nil {
		sc.closeFor(err)
		return false
	}
	wcs := sc.loop.wcs
	for {
		n, err := sc.c.cq.Poll(wcs)
		if err != nil {
			sc.closeFor(err)
			return false
		}
		if sc.stopped() {
			// The path is closed: the client resends what it had in
			// flight here on another path, so running requests still
			// in this batch would only run them twice.
			return false
		}
		sc.loop.beginBatch(sc) // the answers go out at the end of the loop's batch
		for i := range wcs[:n] {
			if w := &wcs[i]; !sc.onWC(w) {
				sc.setPolling(false)
				if !sc.isDead() {
					s.logf("path %v cid %d: completion %v status %v imm %#x closes the path", sc.local, sc.c.cid, w.Opcode, w.Status, w.Imm)
				}
				go s.closePath(sc.p)
				return false
			}
		}
		if sc.rb.Len() > 0 {
			if _, err := sc.rb.Post(sc.c.qp); err != nil {
				go s.closePath(sc.p)
				return false
			}
		}
		if n < len(wcs) {
			return true
		}
	}
}

// onWC handles one completion; false closes the path.
func (sc *serverConn) onWC(wc *rdma.WC) bool {
	if wc.Status != rdma.WCSuccess {
		return false
	}
	switch wc.Opcode {
	case rdma.WCRecv:
		if sc.c.cid != 0 {
			return false // a client sends only WRITE-with-IMM on IO connections
		}
		if wc.WRID == infoRecvID {
			return sc.onInfoReq(int(wc.ByteLen))
		}
		if !sc.p.fence || wc.WRID >= uint64(sc.c.nrecv) {
			return false
		}
		sc.rb.Add(wc.WRID, sc.c.recvSGE(int(wc.WRID)))
		return sc.onFenceReq(sc.c.rbuf[int(wc.WRID)*recvSlot : int(wc.WRID)*recvSlot+min(int(wc.ByteLen), recvSlot)])
	case rdma.WCRecvRDMAWithImm:
		sc.p.hbMissed.Store(0)
		sc.rb.Add(wc.WRID, sc.c.recvSGE(int(wc.WRID)))
		return sc.onImm(wc.Imm)
	}
	return true // send completions
}

func (sc *serverConn) onInfoReq(n int) bool {
	s := sc.p.sess.s
	var req rtrs.InfoReq
	off := sc.c.extraOff()
	if n < rtrs.InfoReqSize || req.Unmarshal(sc.c.rbuf[off:off+n]) != nil {
		return false
	}
	name := req.NameString()
	if err := s.tab.Establish(sc.p.core, &req); err != nil {
		s.logf("path %v: session %q refused: %v", sc.local, name, err)
		return false // the kernel closes the path too
	}
	// Heartbeats start now, as the kernel's (process_info_req): before,
	// one could take the receive the client posted for the INFO_RSP.
	s.mu.Lock()
	if !sc.p.up && !sc.p.closed && !s.done {
		s.wg.Add(1)
		go s.heartbeat(sc.p)
	}
	sc.p.up = true
	s.mu.Unlock()
	// INFO_RSP: one descriptor for the whole pool (flags 0: sg_cnt 1
	// divides queue_depth).
	qd, chunk := s.cfg.QueueDepth, s.cfg.ChunkSize
	rsp := rtrs.InfoRsp{Desc: []rtrs.SGDesc{{Addr: sc.mr.Addr(), Key: sc.mr.RKey(), Len: uint32(qd * chunk)}}}
	sc.p.core.AddProof(&rsp)
	roff := off + infoReqRecvSize
	k, err := rsp.MarshalTo(sc.c.rbuf[roff:])
	if err != nil {
		return false
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.dead {
		return false
	}
	sc.sb.Add(rdma.SendWR{Opcode: rdma.WRSend, Flags: rdma.SendSignaled}, sc.c.rmr.SGE(roff, k))
	_, err = sc.sb.Post(sc.c.qp)
	return err == nil
}

// onFenceReq handles a FenceReq on cid 0: the path it names is shut
// (rtrs.ServerTable.FencePath's rules) before the answer goes out; false
// closes sc's path.
func (sc *serverConn) onFenceReq(b []byte) bool {
	s := sc.p.sess.s
	var req rtrs.FenceReq
	if err := req.Unmarshal(b); err != nil {
		s.logf("path %v: %v", sc.local, err)
		return false
	}
	errno := 0
	target, err := s.tab.FencePath(sc.p.core, req.SessUUID)
	switch {
	case err != nil:
		errno = -int(rtrs.ErrnoOr(err, syscall.EINVAL))
	case target != nil:
		tp := target.Owner().(*serverPath)
		if conns, first := s.shutPath(tp); first {
			go s.freePath(tp, conns)
		}
	}
	return sc.sendImm(rtrs.FenceRspImm(errno)) == nil
}

func (sc *serverConn) onImm(imm uint32) bool {
	s := sc.p.sess.s
	switch t, _ := rtrs.SplitImm(imm); t {
	case rtrs.ImmHBMsg:
		return sc.sendImm(rtrs.HeartbeatAckImm) == nil
	case rtrs.ImmHBAck:
		return true
	case rtrs.ImmIOReq:
	default:
		return false
	}
	if !sc.p.core.Serving() {
		// Before INFO_REQ a client has no business sending IO: close.
		// After the path closed, its requests are resent elsewhere.
		if sc.p.core.State() == rtrs.ServerPathConnecting {
			s.logf("path %v cid %d: IO request before session establishment; closing the path", sc.local, sc.c.cid)
		}
		return false
	}
	m, err := s.codec.Decode(imm)
	if err != nil || m.Type != rtrs.ImmIOReq {
		return false
	}
	chunk := s.cfg.ChunkSize
	mem := sc.p.sess.chunks[int(m.BufID)*chunk : (int(m.BufID)+1)*chunk]
	req, err := rtrs.ParseIOReq(mem, m.Off)
	if err != nil {
		if errors.Is(err, rtrs.ErrBadType) {
			return false
		}
		return true // dropped silently, as the kernel does
	}
	io := &sc.p.ios[m.BufID]
	if !io.busy.CompareAndSwap(false, true) {
		return false // a buffer id reused before its answer
	}
	core := sc.p.sess.core
	io.sc, io.bufID, io.Sess, io.Session, io.Local = sc, m.BufID, core, core.Name(), sc.local
	io.Write = req.Type == rtrs.MsgWrite
	io.Usr, io.Data, io.hasDesc = req.Usr, req.Data, false
	if !io.Write {
		if req.Descs.Len() > rtrs.ServerMaxReadSGCnt {
			io.busy.Store(false)
			return true // dropped, as the kernel does
		}
		if req.Descs.Len() == 1 {
			io.desc, io.hasDesc = req.Descs.At(0), true
			io.Data = mem[:min(int(io.desc.Len), len(mem))]
		}
	}
	sc.p.inflight.Add(1)
	core.Hold() // Complete releases it
	bytes := uint64(len(io.Usr) + len(io.Data))
	if io.Write {
		sc.p.stats.RecordWrite(0, bytes)
	} else {
		sc.p.stats.RecordRead(0, bytes)
	}
	if !sc.p.sess.gate.Enter(int(m.BufID), io) {
		// The chunk is still in use by the request of a failed path that
		// this one is the resend of; the stale request's Complete runs
		// this one.
		return true
	}
	io.onLoop = true
	s.serve(io)
	io.onLoop = false
	return true
}

func (s *Server) serve(io *ServerIO) {
	if h := s.cfg.Handler; h != nil {
		h.HandleIO(io)
	} else {
		io.Complete(-int(syscall.EIO))
	}
}

// Complete answers the request: errno is 0 or a negative errno. A
// successful read RDMA-writes Data to the client's buffer first; the answer
// is a zero-length RDMA-WRITE-with-IMM carrying IO_RSP(buf id, errno), as
// the kernel server posts without always_invalidate.
func (io *ServerIO) Complete(errno int) {
	sc, p := io.sc, io.sc.p
	imm, err := rtrs.IORspImm(io.bufID, errno, false)
	if err != nil {
		imm, _ = rtrs.IORspImm(io.bufID, -int(syscall.EIO), false)
	}
	withData := errno == 0 && !io.Write && io.hasDesc && len(io.Data) > 0
	var data rdma.SGE
	var desc rtrs.SGDesc
	if withData {
		off := int(uintptr(unsafe.Pointer(&io.Data[0])) - uintptr(unsafe.Pointer(&p.sess.chunks[0])))
		data, desc = sc.mr.SGE(off, len(io.Data)), io.desc
	}
	// Free the chunk and the slot before answering: once the answer is
	// out, the client may reuse the buffer id at once, on another
	// connection whose poller runs concurrently. The chunk itself stays
	// untouched until the client has the answer, which travels behind the
	// data on this QP; a request waiting at the gate is the resend of this
	// very request, which puts the same data in the chunk.
	next, handOff := p.sess.gate.Leave(int(io.bufID))
	io.busy.Store(false)
	if handOff {
		go p.sess.s.serve(next)
	}
	sc.mu.Lock()
	if !sc.dead {
		var err error
		if sc.sb.Cap()-sc.sb.Len() < 2 {
			_, err = sc.sb.Post(sc.c.qp)
		}
		if err == nil {
			if withData {
				sc.sb.Add(rdma.SendWR{Opcode: rdma.WRWrite, RemoteAddr: desc.Addr, RKey: desc.Key}, data)
			}
			var flags rdma.SendFlags
			if sc.sent%signalInterval(p.sess.s.cfg.QueueDepth) == 0 {
				flags = rdma.SendSignaled
			}
			sc.sent++
			sc.sb.Add(rdma.SendWR{Opcode: rdma.WRWriteWithImm, Flags: flags, Imm: imm})
			if !sc.polling {
				// Not on the loop's batch (an asynchronous backend): post now.
				_, err = sc.sb.Post(sc.c.qp)
			}
		}
		if err != nil {
			sc.sb.Reset()
			sc.mu.Unlock()
			p.sess.s.logf("path %v: posting a response: %v", sc.local, err)
			go p.sess.s.closePath(p)
			p.inflight.Add(-1)
			p.sess.core.Release()
			return
		}
	}
	sc.mu.Unlock()
	p.inflight.Add(-1)
	p.sess.core.Release()
}
