package tcp

import (
	"net"
	"sync"
	"syscall"

	"github.com/urnbd/urnbd/rtrs"
)

// PathState is the state of a server path, as in the kernel server.
type PathState int

// Server path states.
const (
	// PathConnecting: connections are being added; INFO_REQ not seen yet.
	PathConnecting PathState = iota
	// PathConnected: INFO_REQ processed; the path serves IO.
	PathConnected
	// PathClosed: the path was closed and removed from its session.
	PathClosed
)

// String returns the kernel-style name of s.
func (s PathState) String() string {
	switch s {
	case PathConnecting:
		return "CONNECTING"
	case PathConnected:
		return "CONNECTED"
	case PathClosed:
		return "CLOSED"
	}
	return "UNKNOWN"
}

// ServerSession is a client session on the server: the paths that share a
// paths_uuid and the chunk indexes. Its fields are guarded by the Server.
type ServerSession struct {
	pathsUUID rtrs.UUID
	name      string // from the first INFO_REQ
	paths     []*ServerPath
	io        sessionIO
}

// ServerPath is one path of a session: CIDNum connections sharing a
// sess_uuid.
type ServerPath struct {
	sess     *ServerSession
	sessUUID rtrs.UUID
	state    PathState
	reconCnt uint16
	src, dst net.Addr // client and server address of cid 0
	conns    []*ServerConn
}

// ServerConn is one accepted TCP connection of a path.
type ServerConn struct {
	nc     net.Conn
	cid    uint16
	path   *ServerPath
	wmu    sync.Mutex // guards wbuf, bufs, inLoop and writes to nc
	wbuf   []byte     // answers gathered in a batch
	inLoop bool
	bufs   net.Buffers // a writev of gathered answers and read data, in iovArr
	iovArr [3][]byte
	hdr    [HeaderSize]byte // the answer header in bufs
}

// CID returns the connection's index in its path.
func (c *ServerConn) CID() uint16 { return c.cid }

// NetConn returns the underlying TCP connection.
func (c *ServerConn) NetConn() net.Conn { return c.nc }

// SessionInfo is a snapshot of a server session.
type SessionInfo struct {
	Name      string
	PathsUUID rtrs.UUID
	Paths     []PathInfo
}

// PathInfo is a snapshot of a server path.
type PathInfo struct {
	SessUUID rtrs.UUID
	State    PathState
	ReconCnt uint16
	CIDNum   int
	// Conns is the number of connected cids.
	Conns    int
	Src, Dst string
}

func (p *ServerPath) info() PathInfo {
	pi := PathInfo{SessUUID: p.sessUUID, State: p.state, ReconCnt: p.reconCnt, CIDNum: len(p.conns)}
	for _, c := range p.conns {
		if c != nil {
			pi.Conns++
		}
	}
	if p.src != nil {
		pi.Src, pi.Dst = p.src.String(), p.dst.String()
	}
	return pi
}

// sessions is the server's bookkeeping of sessions by paths_uuid. It is not
// locked; the Server holds its mutex around every call.
type sessions struct {
	byUUID map[rtrs.UUID]*ServerSession
}

// attach applies the kernel's session/path checks (RTRS-RNBD-WIRE.md §2.4
// steps 6 and 7) to a connection request and, if they pass, records c in
// its path. It returns the errno of the refusal, or 0.
func (s *sessions) attach(req *rtrs.ConnReq, c *ServerConn) syscall.Errno {
	sess := s.byUUID[req.PathsUUID]
	newSess := false
	if sess == nil {
		if !req.FirstConn {
			return syscall.ENXIO
		}
		sess = &ServerSession{pathsUUID: req.PathsUUID}
		newSess = true
	}
	var path *ServerPath
	for _, p := range sess.paths {
		if p.sessUUID == req.SessUUID {
			path = p
			break
		}
	}
	if path != nil {
		if path.state != PathConnecting || len(path.conns) != int(req.CIDNum) || path.conns[req.CID] != nil {
			return syscall.ECONNRESET
		}
	} else {
		if len(sess.paths) >= rtrs.MaxPathsNum {
			return syscall.ECONNRESET
		}
		src, dst := c.nc.RemoteAddr(), c.nc.LocalAddr()
		for _, p := range sess.paths {
			if samePath(p.src, p.dst, src, dst) {
				return syscall.EEXIST
			}
		}
		path = &ServerPath{sess: sess, sessUUID: req.SessUUID, src: src, dst: dst,
			conns: make([]*ServerConn, req.CIDNum)}
		sess.paths = append(sess.paths, path)
	}
	if newSess {
		s.byUUID[req.PathsUUID] = sess
	}
	path.reconCnt = req.ReconCnt
	path.conns[req.CID] = c
	c.path = path
	return 0
}

// samePath reports whether two paths join the same (client IP, server
// IP:port) pair.
func samePath(src1, dst1, src2, dst2 net.Addr) bool {
	a1, ok1 := src1.(*net.TCPAddr)
	a2, ok2 := src2.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return src1.String() == src2.String() && dst1.String() == dst2.String()
	}
	return a1.IP.Equal(a2.IP) && dst1.String() == dst2.String()
}

// setName records the session name of a path's INFO_REQ with the kernel's
// rule: no other session may use the name (EPERM); a session keeps the name
// of its first path.
func (s *sessions) setName(p *ServerPath, name string) syscall.Errno {
	for _, o := range s.byUUID {
		if o != p.sess && o.name == name {
			return syscall.EPERM
		}
	}
	if p.sess.name != "" && p.sess.name != name {
		return syscall.EPERM
	}
	p.sess.name = name
	p.state = PathConnected
	return 0
}

// remove takes p out of its session, deletes the session when it has no
// path left, and returns the connections to close.
func (s *sessions) remove(p *ServerPath) []*ServerConn {
	if p.state == PathClosed {
		return nil
	}
	p.state = PathClosed
	sess := p.sess
	for i, o := range sess.paths {
		if o == p {
			sess.paths = append(sess.paths[:i], sess.paths[i+1:]...)
			break
		}
	}
	if len(sess.paths) == 0 && s.byUUID[sess.pathsUUID] == sess {
		delete(s.byUUID, sess.pathsUUID)
	}
	conns := p.conns
	p.conns = make([]*ServerConn, len(conns))
	return conns
}

func (s *sessions) snapshot() []SessionInfo {
	out := make([]SessionInfo, 0, len(s.byUUID))
	for _, sess := range s.byUUID {
		si := SessionInfo{Name: sess.name, PathsUUID: sess.pathsUUID}
		for _, p := range sess.paths {
			si.Paths = append(si.Paths, p.info())
		}
		out = append(out, si)
	}
	return out
}
