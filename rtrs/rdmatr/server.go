package rdmatr

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/chunkgate"
)

// ServerConfig holds the parameters a server advertises in its ConnRsp.
type ServerConfig struct {
	rtrs.ServerConfig
	// Handler serves the IO requests; nil answers every request with -EIO.
	Handler ServerHandler
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
	// HandlerCtx is the handler's, for a request it completes later (a
	// backend operation on the loop: LoopSQE); the server does not touch
	// it.
	HandlerCtx any

	sc      *serverConn
	bufID   uint32
	desc    rtrs.SGDesc
	hasDesc bool
	busy    atomic.Bool
	onLoop  bool        // the handler runs on the loop of sc (LoopSQE)
	bkDone  BackendDone // the backend operation's, while on the loop
}

// Server accepts RTRS connections over RDMA CM, groups them into sessions
// (by paths_uuid) and paths (by sess_uuid), and serves their IO requests
// with the configured Handler on one loop per CPU (server_loop.go).
type Server struct {
	cfg   ServerConfig
	codec rtrs.ImmCodec // immediates of the configured queue depth and chunk size
	tab   *rtrs.ServerTable
	owned bool // tab is the server's own
	ch    *rdma.EventChannel
	lns   []*rdma.CMID
	quit  chan struct{}
	wg    sync.WaitGroup
	loops []*serverLoop // one per CPU (server_loop.go)
	mu    sync.Mutex
	sess  map[*rtrs.ServerSession]*serverSession
	paths map[*serverPath]struct{}
	conns map[*rdma.CMID]*serverConn
	done  bool
}

// serverSession is the RDMA side of a session of the session layer
// (rtrs.ServerSession): its protection domains with the registrations of
// its pool, and its chunk gate.
type serverSession struct {
	s      *Server
	core   *rtrs.ServerSession
	chunks []byte                      // queue_depth × chunk: the session layer's pool
	gate   *chunkgate.Gate[*ServerIO]  // one request per chunk over all paths (failover)
	devs   map[rdma.Context]*sessionPD // by device; under Server.mu
}

// sessionPD is a session's protection domain on one device, with the
// session's chunk pool registered in it. Each session has its own, so
// that the rkey of one session's pool is useless on another session's
// QPs: the device refuses a remote access whose rkey is not of the QP's
// PD (a protection error to the peer, nothing written). The kernel's
// server shares one PD per device among all sessions.
//
// It is keyed by device context, not by device name: a device removed
// and added again under the same name is a new context, where an old PD
// cannot be used.
type sessionPD struct {
	pd *rdma.PD
	mr *rdma.MR // the chunk pool; nil once the session is freed
	// refs are the session's hold (until its pool is deregistered) and
	// one per connection whose QP is in pd; the PD goes with the last.
	refs int
}

// release drops one hold on d, freeing the PD with the last; Server.mu is
// held.
func (d *sessionPD) release() {
	if d.refs--; d.refs == 0 {
		d.pd.Dealloc()
		d.pd = nil
	}
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
	pd    *sessionPD // the session's on this connection's device: its QP is in it
	mr    *rdma.MR   // the chunk pool registered in pd
	local netip.AddrPort
	mu    sync.Mutex // guards sb, dead and polling
	sb    *rdma.SendBatch
	rb    *rdma.RecvBatch // the loop's only
	dead  bool
	sent  int // answers posted, for signalInterval
	// polling is set while the loop handles a batch of completions:
	// answers completed meanwhile wait in sb, and the loop posts them
	// all with one ibv_post_send after the batch (rxe's provider makes a
	// syscall per post).
	polling bool
	stop    chan struct{}
	wg      sync.WaitGroup // done when the loop has let go of the connection
	loop    *serverLoop
	// The loop's, on its thread only: the connection's slot there, and
	// whether it is in the loop, its poll in the ring, being removed.
	loopSlot int
	inLoop   bool
	pollOn   bool
	removing bool
	batching bool // its answers wait for the loop's endBatch
}

// NewServer checks cfg (as the kernel checks its module parameters) and
// returns a server. Listen adds addresses to listen on.
func NewServer(cfg ServerConfig) (*Server, error) {
	var err error
	if cfg.ServerConfig, err = cfg.ServerConfig.Checked(); err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr server: %w", err)
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
		conns: map[*rdma.CMID]*serverConn{}}
	if s.tab == nil {
		s.tab = rtrs.NewServerTable(rtrs.ServerTableConfig{Logf: cfg.Logf})
		s.owned = true
	}
	if err := s.startLoops(); err != nil {
		ch.Close()
		if s.owned {
			s.tab.Close()
		}
		return nil, err
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
	s.stopLoops()
	// The sessions' registrations and protection domains go when the
	// session layer frees them.
	s.tab.Wait()
	for _, l := range s.lns {
		l.Destroy()
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
