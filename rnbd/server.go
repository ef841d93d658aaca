package rnbd

import (
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// ServerConfig configures an RNBD server.
type ServerConfig struct {
	// DevSearchPath is the folder the clients' device paths are relative
	// to; it may contain %SESSNAME% (see ResolveDevPath).
	DevSearchPath string
	// MemoryExports are devices held in memory, by name (a device_path
	// that names one exactly opens it) and size in bytes (a multiple of
	// 4096), for demos and benchmarks. Their data is lost when the
	// server stops.
	MemoryExports map[string]uint64
	// AsyncIO performs the reads, writes and flushes of files and block
	// devices through io_uring, so that a connection's requests overlap
	// on the backend; without it they run in the transport's goroutine,
	// one at a time. Either way a request failed over by the client waits
	// until the stale copy of the failed path is done with the chunk (the
	// RTRS servers' chunk gate).
	AsyncIO bool
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
	sessions sync.Map           // name → *serverSession, read without mu
	exports  map[string]*export // by resolved path; under mu
	memory   *memoryStores
	engine   *ioEngine // nil: backend I/O is synchronous
}

// export is one file or block device opened by one or more sessions.
type export struct {
	path    string
	writers int // mappings with access mode rw or migration
	users   int
}

type serverSession struct {
	name string
	ver  uint8
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
	exp     *export
	mode    AccessMode
	be      *backend
	refs    atomic.Int64 // requests running on be
	closing atomic.Bool
}

// NewServer returns an RNBD server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.DevSearchPath == "" {
		cfg.DevSearchPath = "/"
	}
	memory, err := newMemoryStores(cfg.MemoryExports)
	if err != nil {
		return nil, err
	}
	srv := &Server{cfg: cfg, exports: make(map[string]*export), memory: memory}
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
	Session string
	Write   bool
	Usr     []byte
	Data    []byte
	// io completes the RTRS request when the answer is pending.
	io completer
}

// pending is what handle returns when the answer comes later, through
// request.io.
const pending = 1

// HandleIO implements tcp.ServerHandler: one RNBD message per RTRS request.
func (s *Server) HandleIO(io *tcp.ServerIO) {
	r := request{io.Session, io.Write, io.Usr, io.Data, io}
	if e := s.handle(&r); e != pending {
		io.Complete(e)
	}
}

// RDMA returns the server as the handler of an RTRS server over RDMA.
func (s *Server) RDMA() rdmatr.ServerHandler { return rdmaHandler{s} }

type rdmaHandler struct{ s *Server }

func (h rdmaHandler) HandleIO(io *rdmatr.ServerIO) {
	r := request{io.Session, io.Write, io.Usr, io.Data, io}
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

// session returns the named session, creating it; s.mu is held.
func (s *Server) session(name string) *serverSession {
	if v, ok := s.sessions.Load(name); ok {
		return v.(*serverSession)
	}
	sess := &serverSession{name: name, ver: ProtoVerMajor}
	s.sessions.Store(name, sess)
	return sess
}

func (s *Server) sessInfo(io *request) int {
	var m SessInfo
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	s.mu.Lock()
	sess := s.session(io.Session)
	sess.ver = min(m.Ver, ProtoVerMajor)
	rsp := SessInfoRsp{Ver: sess.ver}
	s.mu.Unlock()
	if _, err := rsp.MarshalTo(io.Data); err != nil {
		return -int(syscall.EINVAL)
	}
	return 0
}

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
	name := m.DevNameString()
	mem, isMem, err := s.memory.lookup(name)
	path := memoryPrefix + name
	if !isMem {
		path, err = resolveExport(s.cfg.DevSearchPath, io.Session, name)
	}
	if err != nil {
		s.logf("rnbd: session %s: open %q refused: %v", io.Session, name, err)
		return errnoOf(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.session(io.Session)
	devs := sess.table()
	id := -1
	for i, d := range devs {
		if d != nil && d.exp.path == path {
			id = i // the kernel answers a repeated open with the same id
			break
		}
	}
	if id < 0 {
		exp := s.exports[path]
		if exp == nil {
			exp = &export{path: path}
		}
		switch m.AccessMode {
		case AccessRO:
		case AccessRW:
			if exp.writers > 0 {
				return -int(syscall.EPERM)
			}
		case AccessMigration:
			if exp.writers >= 2 {
				return -int(syscall.EPERM)
			}
		default:
			return -int(syscall.EINVAL)
		}
		var be *backend
		if mem != nil {
			be = &backend{mem: mem, size: uint64(len(mem.mem)), lbs: 512, readOnly: m.AccessMode == AccessRO}
		} else {
			be, err = openBackend(path, m.AccessMode == AccessRO)
		}
		if err != nil {
			s.logf("rnbd: session %s: open %s: %v", io.Session, path, err)
			return errnoOf(err)
		}
		if m.AccessMode != AccessRO {
			exp.writers++
		}
		exp.users++
		s.exports[path] = exp
		d := &mapping{exp: exp, mode: m.AccessMode, be: be}
		devs = append([]*mapping(nil), devs...)
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
		s.logf("rnbd: session %s: opened %s as device %d (%s)", io.Session, path, id, m.AccessMode)
	}
	var rsp OpenRsp
	rsp.DeviceID = uint32(id)
	devs[id].be.geometry(&rsp, s.cfg.MaxIOSize)
	clear(io.Data)
	if _, err := rsp.MarshalTo(io.Data); err != nil {
		return -int(syscall.EINVAL)
	}
	return 0
}

func (s *Server) close(io *request) int {
	var m Close
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.sessions.Load(io.Session)
	if !ok {
		return 0 // the kernel answers 0 for unknown ids too
	}
	sess := v.(*serverSession)
	devs := sess.table()
	if int(m.DeviceID) >= len(devs) || devs[m.DeviceID] == nil {
		return 0
	}
	d := devs[m.DeviceID]
	devs = append([]*mapping(nil), devs...)
	devs[m.DeviceID] = nil
	sess.devs.Store(&devs)
	// Requests already running on the device finish first.
	d.closing.Store(true)
	for d.refs.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	if d.be.f != nil {
		d.be.f.Close()
	}
	if d.mode != AccessRO {
		d.exp.writers--
	}
	if d.exp.users--; d.exp.users == 0 {
		delete(s.exports, d.exp.path)
	}
	s.logf("rnbd: session %s: closed device %d (%s)", io.Session, m.DeviceID, d.exp.path)
	return 0
}

// handleIO serves a block request. The device table is read under the lock;
// the I/O itself runs without it.
func (s *Server) handleIO(io *request) int {
	var m IO
	if err := m.Unmarshal(io.Usr); err != nil {
		return -int(syscall.EINVAL)
	}
	var d *mapping
	if v, ok := s.sessions.Load(io.Session); ok {
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
	off, n := int64(m.Sector)<<9, int(m.BiSize)
	if s.engine != nil && io.io != nil && d.be.async(op) {
		if e := d.be.check(op, off, n); e != 0 {
			return e
		}
		d.refs.Add(1) // the engine's, dropped at completion
		if s.engine.submit(io.io, d, op, m.RW.FUA(), off, io.Data) {
			return pending
		}
		d.refs.Add(-1)
	}
	return d.be.serve(op, m.RW.FUA(), off, n, io.Data)
}

// String describes the server for logs.
func (s *Server) String() string {
	return fmt.Sprintf("rnbd server (dev_search_path %s)", s.cfg.DevSearchPath)
}
