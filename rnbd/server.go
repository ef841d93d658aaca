package rnbd

import (
	"errors"
	"fmt"
	"log"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// ServerConfig configures an RNBD server.
type ServerConfig struct {
	// DevSearchPath is the folder the clients' device paths are relative
	// to; it may contain %SESSNAME% (see ResolveDevPath). Empty exports no
	// files or block devices, only MemoryExports: unlike the kernel's
	// server, whose default is "/" (DefaultDevSearchPath), nothing of the
	// host is exported unless asked for.
	DevSearchPath string
	// MemoryExports are devices held in memory, by name (a device_path
	// that names one exactly opens it) and size in bytes (a multiple of
	// 4096), for demos and benchmarks. Their data is lost when the
	// server stops.
	MemoryExports map[string]uint64
	// Policy, if not nil, says which clients may open which exports
	// (Server.SetPolicy replaces it); nil lets every client open every
	// export.
	Policy *Policy
	// AsyncIO performs the reads, writes and flushes of files and block
	// devices through io_uring, so that a connection's requests overlap
	// on the backend; without it they run in the transport's goroutine,
	// one at a time. Either way a request failed over by the client waits
	// until the stale copy of the failed path is done with the chunk (the
	// RTRS servers' chunk gate).
	AsyncIO bool
	// LoopIO performs the reads, writes and flushes of files and block
	// devices of requests over RDMA on the RTRS server loop's own
	// io_uring (rdmatr.ServerIO.LoopSQE): submitted with the loop's
	// wait, completed on its thread, the answers posted with the loop's
	// batch; no other thread and no system call of their own. Requests
	// that do not run on a loop (over TCP, or started after waiting for
	// their chunk) do their I/O as without it (AsyncIO, or synchronously).
	LoopIO bool
	// MaxIOSize is the transport's max_io_size, announced as the devices'
	// max_hw_sectors.
	MaxIOSize int
	// Logf, if set, receives one line per open and close.
	Logf func(format string, args ...any)
}

// Server serves RNBD sessions: it opens the devices clients ask for, under
// the kernel server's access rules, and performs their block requests.
// It is the handler of an RTRS server.
type Server struct {
	cfg ServerConfig

	mu       sync.Mutex         // control path: opens, closes, sessions
	sessions sync.Map           // *rtrs.ServerSession → *serverSession, read without mu
	exports  map[string]*export // by backend key (device and inode); under mu
	memory   *memoryStores
	engine   *ioEngine          // nil: backend I/O is synchronous
	loopDone rdmatr.BackendDone // made once: a method value per request would allocate
	policy   atomic.Pointer[Policy]
}

// export is one file or block device opened by one or more sessions.
type export struct {
	key     string // backend.key
	path    string
	writers int // mappings with access mode rw or migration
	users   int
}

type serverSession struct {
	name string
	ver  uint8
	// released is set under Server.mu once the RTRS session is gone: no
	// device opens on it any more.
	released bool
	// devs is the device table by id (nil = free), replaced as a whole
	// under Server.mu and read without a lock by the I/O path.
	devs atomic.Pointer[[]*mapping]
}

func (sess *serverSession) table() []*mapping {
	if p := sess.devs.Load(); p != nil {
		return *p
	}
	return nil
}

// mapping is one device opened by one session.
type mapping struct {
	id      uint32 // in its session's table, for logs
	exp     *export
	name    string // the device_path the client opened it by (mapping_path)
	mode    AccessMode
	be      *backend
	refs    atomic.Int64 // requests running on be
	closing atomic.Bool
}

// NewServer returns an RNBD server.
func NewServer(cfg ServerConfig) (*Server, error) {
	memory, err := newMemoryStores(cfg.MemoryExports)
	if err != nil {
		return nil, err
	}
	srv := &Server{cfg: cfg, exports: make(map[string]*export), memory: memory}
	srv.policy.Store(cfg.Policy)
	srv.loopDone = srv.onLoopDone
	if cfg.AsyncIO {
		if srv.engine, err = newIOEngine(); err != nil {
			srv.logf("rnbd: backend I/O is synchronous: %v", err)
		}
	}
	return srv, nil
}

// Close stops the backend I/O engine (after the I/O in flight) and frees
// the memory exports. The RTRS servers must be closed first.
func (s *Server) Close() {
	if s.engine != nil {
		s.engine.close()
	}
	s.memory.close()
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

// request is one RTRS request as the server sees it, whatever the
// transport.
type request struct {
	Sess    *rtrs.ServerSession
	Session string
	Write   bool
	Usr     []byte
	Data    []byte
	// io completes the RTRS request when the answer is pending.
	io completer
	// loop, with LoopIO over RDMA, runs the backend I/O on the server
	// loop's ring.
	loop *rdmatr.ServerIO
}

// spliceReader is a request that can answer a read from a file
// descriptor itself (tcp.ServerIO.SpliceRead): false when it cannot.
type spliceReader interface {
	SpliceRead(fd int, off int64) bool
}

// pending is what handle returns when the answer comes later, through
// request.io.
const pending = 1

// HandleIO implements tcp.ServerHandler: one RNBD message per RTRS request.
func (s *Server) HandleIO(io *tcp.ServerIO) {
	r := request{io.Sess, io.Session, io.Write, io.Usr, io.Data, io, nil}
	if e := s.handle(&r); e != pending {
		io.Complete(e)
	}
}

// RDMA returns the server as the handler of an RTRS server over RDMA.
func (s *Server) RDMA() rdmatr.ServerHandler { return rdmaHandler{s} }

type rdmaHandler struct{ s *Server }

func (h rdmaHandler) HandleIO(io *rdmatr.ServerIO) {
	r := request{io.Sess, io.Session, io.Write, io.Usr, io.Data, io, nil}
	if h.s.cfg.LoopIO {
		r.loop = io
	}
	if e := h.s.handle(&r); e != pending {
		io.Complete(e)
	}
}

// handle serves one RNBD message and returns 0 or -errno, or pending when
// io.io will complete it.
func (s *Server) handle(io *request) int {
	t, err := PeekType(io.Usr)
	if err != nil {
		return -int(syscall.EINVAL)
	}
	switch t {
	case MsgIO:
		return s.handleIO(io)
	case MsgSessInfo:
		return s.sessInfo(io)
	case MsgOpen:
		return s.open(io)
	case MsgClose:
		return s.close(io)
	}
	return -int(syscall.EINVAL)
}

// session returns the RNBD state of io's RTRS session, creating it, or nil
// if the session was released meanwhile; s.mu is held.
func (s *Server) session(io *request) *serverSession {
	if v, ok := s.sessions.Load(io.Sess); ok {
		sess := v.(*serverSession)
		if sess.released {
			return nil
		}
		return sess
	}
	if io.Sess.Released() {
		return nil
	}
	sess := &serverSession{name: io.Session, ver: ProtoVerMajor}
	s.sessions.Store(io.Sess, sess)
	return sess
}

// ReleaseSession closes every device of an RTRS session that is gone, as
// the kernel's server does when its RTRS session closes; requests running
// on them finish first. It is the rtrs.ServerTableConfig.OnRelease of the
// server's RTRS session layer.
func (s *Server) ReleaseSession(rs *rtrs.ServerSession) {
	s.mu.Lock()
	v, ok := s.sessions.LoadAndDelete(rs)
	if !ok {
		s.mu.Unlock()
		return
	}
	sess := v.(*serverSession)
	sess.released = true
	var closing []*mapping
	for id, d := range sess.table() {
		if d != nil {
			closing = append(closing, s.detachDevice(sess, uint32(id)))
		}
	}
	s.mu.Unlock()
	for _, d := range closing {
		s.finishClose(sess, d)
	}
}

func (s *Server) sessInfo(io *request) int {
	var m SessInfo
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	if io.Write || len(io.Data) < SessInfoRspSize {
		return -int(syscall.EINVAL) // the answer needs a read's buffer
	}
	s.mu.Lock()
	sess := s.session(io)
	if sess == nil {
		s.mu.Unlock()
		return -int(syscall.ENOTCONN)
	}
	sess.ver = min(m.Ver, ProtoVerMajor)
	rsp := SessInfoRsp{Ver: sess.ver}
	s.mu.Unlock()
	if _, err := rsp.MarshalTo(io.Data); err != nil {
		return -int(syscall.EINVAL)
	}
	return 0
}

// errnoOf is -errno of err, -EIO if it has none.
func errnoOf(err error) int {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return -int(errno)
	}
	return -int(syscall.EIO)
}

func (s *Server) open(io *request) int {
	var m Open
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	if io.Write || len(io.Data) < OpenRspSize {
		// Refused before anything is opened: the answer needs a read's
		// buffer.
		return -int(syscall.EINVAL)
	}
	switch m.AccessMode {
	case AccessRO, AccessRW, AccessMigration:
	default:
		return -int(syscall.EINVAL)
	}
	name := m.DevNameString()
	ro := m.AccessMode == AccessRO
	if p := s.policy.Load(); p != nil {
		peer := peerOf(io.Sess, io.Session)
		if err := p.Allow(peer, name, m.AccessMode); err != nil {
			s.logf("rnbd: audit: open refused: %v, export %q, access mode %s: %v", peer, name, m.AccessMode, err)
			return -int(syscall.EACCES)
		}
	}
	// The export is opened before the lock is taken: opening a file can
	// take long (a slow disk, a network file system), and other sessions'
	// opens and closes must not wait for it.
	var be *backend
	mem, isMem, err := s.memory.lookup(name)
	switch {
	case err != nil:
	case isMem:
		be = &backend{mem: mem, lbs: 512, readOnly: ro, key: memoryPrefix + name, path: memoryPrefix + name}
		be.size.Store(uint64(len(mem.mem)))
	case s.cfg.DevSearchPath == "":
		err = fmt.Errorf("no such memory export, and no files are exported (no dev_search_path): %w", syscall.ENOENT)
	default:
		be, _, err = openExport(s.cfg.DevSearchPath, io.Session, name, ro)
	}
	if err != nil {
		s.logf("rnbd: session %s: open %q refused: %v", io.Session, name, err)
		return errnoOf(err)
	}
	id, added, e := s.addDevice(io, be, name, m.AccessMode)
	if !added {
		be.close()
	}
	if e != 0 {
		return e
	}
	s.mu.Lock()
	d := s.device(io.Sess, uint32(id))
	var rsp OpenRsp
	rsp.DeviceID = uint32(id)
	if d != nil {
		if !added {
			// A repeated open (a client's resize asks so): the size is
			// the export's now, for the answer and for the range check
			// of the mapping's I/O, as the kernel's server reads it
			// from the block device each time.
			d.be.size.Store(be.size.Load())
		}
		d.be.geometry(&rsp, s.cfg.MaxIOSize)
	}
	s.mu.Unlock()
	if d == nil {
		return -int(syscall.ENOTCONN) // closed meanwhile
	}
	clear(io.Data)
	if _, err := rsp.MarshalTo(io.Data); err != nil {
		return -int(syscall.EINVAL)
	}
	return 0
}

// addDevice adds the opened backend be to io's session under the access
// rules and returns its device id, whether be was taken (else the caller
// closes it) and 0 or -errno. A repeated open of the same export with the
// same mode answers the id it has (as the kernel does); with another mode
// it is refused with EEXIST.
func (s *Server) addDevice(io *request, be *backend, name string, mode AccessMode) (id int, added bool, errno int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.session(io)
	if sess == nil {
		return -1, false, -int(syscall.ENOTCONN)
	}
	devs := sess.table()
	for i, d := range devs {
		if d != nil && d.exp.key == be.key {
			if d.mode != mode {
				s.logf("rnbd: session %s: %s already open as device %d (%s), %s refused", io.Session, be.path, i, d.mode, mode)
				return -1, false, -int(syscall.EEXIST)
			}
			return i, false, 0
		}
	}
	exp := s.exports[be.key]
	if exp == nil {
		exp = &export{key: be.key, path: be.path}
	}
	switch mode {
	case AccessRW:
		if exp.writers > 0 {
			s.logf("rnbd: session %s: %s refused rw: already open for writing (map with access_mode=migration to share)", io.Session, be.path)
			return -1, false, -int(syscall.EPERM)
		}
	case AccessMigration:
		if exp.writers >= 2 {
			return -1, false, -int(syscall.EPERM)
		}
	}
	if mode != AccessRO {
		exp.writers++
	}
	exp.users++
	s.exports[be.key] = exp
	d := &mapping{exp: exp, name: name, mode: mode, be: be}
	devs = append([]*mapping(nil), devs...)
	id = -1
	for i, old := range devs {
		if old == nil {
			id = i
			devs[i] = d
			break
		}
	}
	if id < 0 {
		id = len(devs)
		devs = append(devs, d)
	}
	sess.devs.Store(&devs)
	s.logf("rnbd: session %s: opened %s as device %d (%s)", io.Session, be.path, id, mode)
	return id, true, 0
}

// device returns device id of an RTRS session, or nil; s.mu is held.
func (s *Server) device(rs *rtrs.ServerSession, id uint32) *mapping {
	v, ok := s.sessions.Load(rs)
	if !ok {
		return nil
	}
	if devs := v.(*serverSession).table(); int(id) < len(devs) {
		return devs[id]
	}
	return nil
}

func (s *Server) close(io *request) int {
	var m Close
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	s.mu.Lock()
	v, ok := s.sessions.Load(io.Sess)
	if !ok {
		s.mu.Unlock()
		return 0 // the kernel answers 0 for unknown ids too
	}
	sess := v.(*serverSession)
	d := s.detachDevice(sess, m.DeviceID)
	s.mu.Unlock()
	if d != nil {
		s.finishClose(sess, d)
	}
	return 0
}

// detachDevice takes device id out of sess's table, if open, so that no
// request starts on it any more, and returns it; s.mu is held.
func (s *Server) detachDevice(sess *serverSession, id uint32) *mapping {
	devs := sess.table()
	if int(id) >= len(devs) || devs[id] == nil {
		return nil
	}
	d := devs[id]
	devs = append([]*mapping(nil), devs...)
	devs[id] = nil
	sess.devs.Store(&devs)
	d.id = id
	d.closing.Store(true)
	return d
}

// finishClose closes a detached device once the requests running on it
// are done (without s.mu: other sessions' opens and closes go on
// meanwhile), and only then gives its export's access back.
func (s *Server) finishClose(sess *serverSession, d *mapping) {
	for d.refs.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	d.be.close()
	s.mu.Lock()
	if d.mode != AccessRO {
		d.exp.writers--
	}
	if d.exp.users--; d.exp.users == 0 {
		delete(s.exports, d.exp.key)
	}
	s.mu.Unlock()
	s.logf("rnbd: session %s: closed device %d (%s)", sess.name, d.id, d.exp.path)
}

// handleIO serves a block request. The device table is read without a
// lock (the session's entry in a sync.Map, its table an atomic snapshot);
// the I/O runs without one too.
func (s *Server) handleIO(io *request) int {
	var m IO
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	var d *mapping
	if v, ok := s.sessions.Load(io.Sess); ok {
		if devs := v.(*serverSession).table(); int(m.DeviceID) < len(devs) {
			d = devs[m.DeviceID]
		}
	}
	if d == nil {
		return -int(syscall.ENOTCONN)
	}
	d.refs.Add(1)
	defer d.refs.Add(-1)
	if d.closing.Load() {
		return -int(syscall.ENOTCONN)
	}
	op := m.RW.Op()
	if op.HasData() && int(m.BiSize) != len(io.Data) {
		return -int(syscall.EINVAL)
	}
	if io.Write != !op.RTRSRead() {
		return -int(syscall.EINVAL)
	}
	// A sector whose byte offset does not fit an int64 (<< 9 would wrap)
	// is out of range of any device: -1, as the kernel leaves a flush's.
	off, n := int64(-1), int(m.BiSize)
	if m.Sector <= maxSector {
		off = int64(m.Sector) << 9
	}
	// A request with PREFLUSH (its flush must end before it starts) is
	// served in order, on this thread; a flush is one already.
	async := d.be.async(op) && (op == OpFlush || !m.RW.Preflush())
	if io.loop != nil && async {
		if e := d.be.check(op, off, n); e != 0 {
			return e
		}
		if sqe, ud, ok := io.loop.LoopSQE(s.loopDone); ok {
			d.refs.Add(1) // the loop's, dropped at completion
			io.loop.HandlerCtx = d
			prepBackend(sqe, &ioSlot{d: d, op: op, fua: m.RW.FUA(), off: off, data: io.Data}, ud)
			return pending
		}
	}
	if sp, ok := io.io.(spliceReader); ok && op == OpRead && !m.RW.Preflush() && d.be.direct && s.engine == nil {
		// Over TCP with synchronous backend I/O, a large read goes from
		// the backend to the socket through a pipe, never copied into
		// the chunk and out again.
		if e := d.be.check(op, off, n); e != 0 {
			return e
		}
		if sp.SpliceRead(d.be.fd, off) {
			return pending
		}
	}
	if s.engine != nil && io.io != nil && async {
		if e := d.be.check(op, off, n); e != 0 {
			return e
		}
		d.refs.Add(1) // the engine's, dropped at completion
		if s.engine.submit(io.io, d, op, m.RW.FUA(), off, io.Data) {
			return pending
		}
		d.refs.Add(-1)
	}
	return d.be.serve(m.RW, off, n, io.Data)
}

// onLoopDone completes a request whose backend I/O ran on the RTRS server
// loop (LoopIO), on the loop's thread.
func (s *Server) onLoopDone(io *rdmatr.ServerIO, res int32) {
	d := io.HandlerCtx.(*mapping)
	io.HandlerCtx = nil
	var m IO
	m.Unmarshal(io.Usr) // checked when the request started; the chunk holds it still
	off := int64(m.Sector) << 9
	slot := ioSlot{d: d, op: m.RW.Op(), fua: m.RW.FUA(), off: off, data: io.Data}
	errno := slot.finish(res)
	d.refs.Add(-1)
	io.Complete(errno)
}

// maxSector is the largest sector whose byte offset fits an int64.
const maxSector = math.MaxInt64 >> 9

// String describes the server for logs.
func (s *Server) String() string {
	if s.cfg.DevSearchPath == "" {
		return "rnbd server (memory exports only)"
	}
	return fmt.Sprintf("rnbd server (dev_search_path %s)", s.cfg.DevSearchPath)
}
