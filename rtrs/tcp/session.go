package tcp

import (
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// serverPath is the TCP side of a server path (rtrs.ServerPath): its
// connections.
type serverPath struct {
	s    *Server
	core *rtrs.ServerPath
	sio  *sessionIO

	mu     sync.Mutex // guards conns and closed
	conns  []*ServerConn
	closed bool
}

// ClosePath implements rtrs.PathOwner.
func (p *serverPath) ClosePath() { p.s.closePath(p) }

// PathDetails implements rtrs.PathDetailer.
func (p *serverPath) PathDetails() rtrs.PathDetails { return rtrs.PathDetails{Transport: "tcp"} }

// add records c in its slot; false if the path was closed meanwhile.
func (p *serverPath) add(c *ServerConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c.cid] = c
	return true
}

// ServerConn is one accepted TCP connection of a path.
type ServerConn struct {
	nc     net.Conn
	cid    uint16
	path   *serverPath
	slot   *rtrs.ConnSlot
	wmu    sync.Mutex // guards wbuf, bufs, inLoop and writes to nc
	wbuf   []byte     // answers gathered in a batch
	inLoop bool
	bufs   net.Buffers // a writev of gathered answers and read data, in iovArr
	iovArr [3][]byte
	hdr    [frame.HeaderSize]byte // the answer header in bufs
	// SpliceRead's: the connection's raw socket and pipe (guarded by
	// wmu), and noSplice once it is known that it cannot have them.
	raw      syscall.RawConn
	pipe     *splicePipe
	pipeCap  int
	noSplice bool
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
	State    rtrs.ServerPathState
	CIDNum   int
	// Conns is the number of connected cids.
	Conns    int
	Src, Dst string
}

func (p *serverPath) info() PathInfo {
	pi := PathInfo{SessUUID: p.core.SessUUID(), State: p.core.State(), CIDNum: p.core.CIDNum(),
		Src: p.core.Src().String(), Dst: p.core.Dst().String()}
	p.mu.Lock()
	for _, c := range p.conns {
		if c != nil {
			pi.Conns++
		}
	}
	p.mu.Unlock()
	return pi
}

// addrPort turns a TCP address into a netip.AddrPort (zero if it is not
// one).
func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}
