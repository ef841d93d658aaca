package rdmatr

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
)

// ServerConfig holds the parameters a server advertises in its ConnRsp.
type ServerConfig struct {
	// QueueDepth is the number of chunks of every session
	// (sess_queue_depth); default rtrs.DefaultSessQueueDepth.
	QueueDepth int
	// ChunkSize is max_chunk_size, a power of two >= rtrs.MinChunkSize;
	// default rtrs.DefaultMaxChunkSize.
	ChunkSize int
	// MaxHdrSize is the room for user message + RTRS header in a chunk;
	// default rtrs.DefaultMaxHdrSize. max_io_size = ChunkSize - MaxHdrSize.
	MaxHdrSize int
	// Handler serves the IO requests; nil answers every request with -EIO.
	Handler ServerHandler
	// HeartbeatInterval and MissedHeartbeats: a path whose service
	// connection is silent for Interval × (Missed+2) is closed; defaults
	// rtrs.HBInterval and rtrs.HBMissedMax.
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
	// Logf, if set, receives a line for every path closed and why.
	Logf func(format string, args ...any)
	// Sessions is the session layer (limits, session and path rules,
	// release), shared with the server's other transports; nil: a table
	// of the server's own with default limits.
	Sessions *rtrs.ServerTable
}

// ServerHandler serves the IO requests that clients send to a Server.
type ServerHandler interface {
	// HandleIO starts request io. The handler completes it with
	// io.Complete, at once or later from any goroutine; io and its slices
	// stay valid until then.
	HandleIO(io *ServerIO)
}

// ServerIO is one IO request on the server, living in its chunk.
type ServerIO struct {
	// Sess is the client session; it outlives the request.
	Sess *rtrs.ServerSession
	// Session is the client session's name.
	Session string
	// Write is true for a write (data client→server), false for a read.
	Write bool
	// Usr is the user (RNBD) message.
	Usr []byte
	// Data is the written data of a write, or for a read the buffer to fill
	// (chunk memory, as long as the client asked for).
	Data []byte
	// Local is the server address of the connection the request came on
	// (which path carried it).
	Local netip.AddrPort

	sc      *serverConn
	bufID   uint32
	desc    rtrs.SGDesc
	hasDesc bool
	busy    atomic.Bool
}

// Server accepts RTRS connections over RDMA CM, groups them into sessions
// (by paths_uuid) and paths (by sess_uuid), and serves their IO requests
// with the configured Handler, one goroutine per connection.
type Server struct {
	cfg   ServerConfig
	codec rtrs.ImmCodec // immediates of the configured queue depth and chunk size
	tab   *rtrs.ServerTable
	owned bool // tab is the server's own
	ch    *rdma.EventChannel
	lns   []*rdma.CMID
	quit  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	sess  map[*rtrs.ServerSession]*serverSession
	paths map[*serverPath]struct{}
	conns map[*rdma.CMID]*serverConn
	// pds are the protection domains by device context, not by device
	// name: a device removed and added again under the same name is a new
	// context, where an old PD cannot be used.
	pds  map[rdma.Context]*rdma.PD
	done bool
}

// serverSession is the RDMA side of a session of the session layer
// (rtrs.ServerSession): the registrations of its pool and its chunk gate.
type serverSession struct {
	s      *Server
	core   *rtrs.ServerSession
	chunks []byte                     // queue_depth × chunk: the session layer's pool
	gate   *rtrs.ChunkGate[*ServerIO] // one request per chunk over all paths (failover)
	mrs    map[rdma.Context]*rdma.MR  // the chunk pool registered on each device (see Server.pds); under Server.mu
}

// serverPath is the RDMA side of a server path (rtrs.ServerPath).
type serverPath struct {
	sess     *serverSession
	core     *rtrs.ServerPath
	cidNum   int
	conns    []*serverConn
	up       bool // heartbeats started
	closed   bool
	fence    bool       // the client fences (ConnReq.Fence): FenceReq on cid 0, FlagFence
	ios      []ServerIO // by buf id
	inflight atomic.Int32
	hbMissed atomic.Int32
	stats    *rtrs.ServerPathStats
}

type serverConn struct {
	p     *serverPath
	slot  *rtrs.ConnSlot
	c     *conn
	mr    *rdma.MR // chunk pool MR on this connection's device
	local netip.AddrPort
	mu    sync.Mutex // guards sb, dead and polling
	sb    *rdma.SendBatch
	rb    *rdma.RecvBatch // poll goroutine only
	dead  bool
	sent  int // answers posted, for signalInterval
	// polling is set while the poll goroutine handles a batch of
	// completions: answers completed meanwhile wait in sb, and the poll
	// goroutine posts them all with one ibv_post_send after the batch
	// (rxe's provider makes a syscall per post).
	polling bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// NewServer checks cfg (as the kernel checks its module parameters) and
// returns a server. Listen adds addresses to listen on.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.QueueDepth == 0 {
		cfg.QueueDepth = rtrs.DefaultSessQueueDepth
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = rtrs.DefaultMaxChunkSize
	}
	if cfg.MaxHdrSize == 0 {
		cfg.MaxHdrSize = rtrs.DefaultMaxHdrSize
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = rtrs.HBInterval
	}
	if cfg.MissedHeartbeats == 0 {
		cfg.MissedHeartbeats = rtrs.HBMissedMax
	}
	if err := rtrs.CheckServerParams(cfg.QueueDepth, cfg.ChunkSize); err != nil {
		return nil, err
	}
	if cfg.MaxHdrSize >= cfg.ChunkSize {
		return nil, fmt.Errorf("rtrs/rdmatr: max_hdr_size %d >= chunk size %d: %w", cfg.MaxHdrSize, cfg.ChunkSize, rtrs.ErrOutOfRange)
	}
	codec, err := rtrs.NewImmCodec(cfg.QueueDepth, cfg.ChunkSize)
	if err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr: %w", err)
	}
	ch, err := rdma.NewEventChannel()
	if err != nil {
		return nil, err
	}
	if err := ch.SetNonblock(true); err != nil {
		ch.Close()
		return nil, err
	}
	s := &Server{cfg: cfg, codec: codec, tab: cfg.Sessions, ch: ch, quit: make(chan struct{}),
		sess: map[*rtrs.ServerSession]*serverSession{}, paths: map[*serverPath]struct{}{},
		conns: map[*rdma.CMID]*serverConn{}, pds: map[rdma.Context]*rdma.PD{}}
	if s.tab == nil {
		logf := cfg.Logf
		if logf == nil {
			logf = func(string, ...any) {}
		}
		s.tab = rtrs.NewServerTable(rtrs.ServerTableConfig{Logf: logf})
		s.owned = true
	}
	s.wg.Add(1)
	go s.cmLoop()
	return s, nil
}

// Config returns the server's configuration with defaults filled in.
func (s *Server) Config() ServerConfig { return s.cfg }

// Listen starts listening on addr (RDMA CM, TCP port space) and returns
// the bound address (port 0 picks one).
func (s *Server) Listen(addr netip.AddrPort) (netip.AddrPort, error) {
	id, err := s.ch.NewID(rdma.PSTCP)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if err := id.Bind(addr); err != nil {
		id.Destroy()
		return netip.AddrPort{}, err
	}
	if err := id.Listen(64); err != nil {
		id.Destroy()
		return netip.AddrPort{}, err
	}
	s.mu.Lock()
	s.lns = append(s.lns, id)
	s.mu.Unlock()
	return id.LocalAddr(), nil
}

// Close stops listening, closes every path and frees everything.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	var paths []*serverPath
	for p := range s.paths {
		paths = append(paths, p)
	}
	s.mu.Unlock()
	if s.owned {
		s.tab.Close()
	}
	for _, p := range paths {
		s.closePath(p)
	}
	close(s.quit)
	s.wg.Wait()
	// The sessions' registrations go before their protection domains.
	s.tab.Wait()
	for _, l := range s.lns {
		l.Destroy()
	}
	for _, pd := range s.pds {
		pd.Dealloc()
	}
	return s.ch.Close()
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf("rtrs/rdmatr server: "+format, args...)
	}
}

// PathCount returns the number of live paths over all sessions.
func (s *Server) PathCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.paths)
}

// DisconnectPaths closes every path whose connections come in on local
// address addr (the server's side of the path), as the kernel's
// per-path "disconnect" file does; clients see the path fail.
func (s *Server) DisconnectPaths(addr netip.Addr) int {
	s.mu.Lock()
	var paths []*serverPath
	for p := range s.paths {
		for _, sc := range p.conns {
			if sc != nil && sc.local.Addr() == addr {
				paths = append(paths, p)
				break
			}
		}
	}
	s.mu.Unlock()
	for _, p := range paths {
		s.closePath(p)
	}
	return len(paths)
}

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
	go sc.pollLoop()
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
	ss := &serverSession{s: s, core: core, chunks: core.Pool(), gate: rtrs.NewChunkGate[*ServerIO](s.cfg.QueueDepth),
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
	sc := &serverConn{p: p, c: c, mr: mr, local: id.LocalAddr(), stop: make(chan struct{}),
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

// waitEvent takes the completion channel's event, parking in the
// netpoller until there is one, and re-arms the CQ; false when woken by
// the path's stop (or when the channel failed: then err is set).
func (sc *serverConn) waitEvent(w *netpollFd) (ok bool, err error) {
	c := sc.c
	rerr := w.wait(func() bool {
		ok, err = c.takeEvent()
		return ok || err != nil // else park until readable
	})
	if rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded) {
		err = rerr
	}
	if err != nil || !ok {
		return false, err
	}
	return true, c.cq.ReqNotify(false)
}

func (sc *serverConn) pollLoop() {
	defer sc.wg.Done()
	wcs := make([]rdma.WC, pollBatch)
	s := sc.p.sess.s
	// The poller parks in the netpoller (or polls with a timeout if the
	// channel cannot be polled that way); stop wakes it.
	w, werr := newNetpollFd(sc.c.cc.Fd())
	if werr == nil {
		defer w.close()
		go func() {
			<-sc.stop
			w.f.SetReadDeadline(time.Now())
		}()
	}
	for {
		select {
		case <-sc.stop:
			return
		default:
		}
		if werr == nil {
			ok, err := sc.waitEvent(w)
			if err != nil {
				s.logf("path %v cid %d: %v", sc.local, sc.c.cid, err)
				go s.closePath(sc.p)
				return
			}
			if !ok {
				continue
			}
		} else {
			if !waitFd(sc.c.cc.Fd(), 100*time.Millisecond) {
				continue
			}
			if err := sc.c.drainEvents(); err != nil {
				s.logf("path %v cid %d: %v", sc.local, sc.c.cid, err)
				go s.closePath(sc.p)
				return
			}
		}
		for {
			n, err := sc.c.cq.Poll(wcs)
			if err != nil {
				s.logf("path %v cid %d: %v", sc.local, sc.c.cid, err)
				go s.closePath(sc.p)
				return
			}
			select {
			case <-sc.stop:
				// The path is closed: the client resends what it had
				// in flight here on another path, so running requests
				// still in this batch would only run them twice.
				return
			default:
			}
			sc.setPolling(true)
			for i := range wcs[:n] {
				if w := &wcs[i]; !sc.onWC(w) {
					sc.setPolling(false)
					if !sc.isDead() {
						s.logf("path %v cid %d: completion %v status %v imm %#x closes the path", sc.local, sc.c.cid, w.Opcode, w.Status, w.Imm)
					}
					go s.closePath(sc.p)
					return
				}
			}
			if err := sc.setPolling(false); err != nil {
				s.logf("path %v: posting answers: %v", sc.local, err)
				go s.closePath(sc.p)
				return
			}
			if sc.rb.Len() > 0 {
				if _, err := sc.rb.Post(sc.c.qp); err != nil {
					go s.closePath(sc.p)
					return
				}
			}
			if n < len(wcs) {
				break
			}
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
	if err := s.tab.Establish(sc.p.core, name); err != nil {
		s.logf("path %v: session name %q refused: %v", sc.local, name, err)
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
	roff := off + rtrs.InfoReqSize
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
	s.serve(io)
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
				// Not on the poll goroutine's batch: post now.
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
