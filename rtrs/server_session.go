package rtrs

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
)

// ServerPathState is the state of a server path.
type ServerPathState int32

// Server path states. A path moves only forward: Connecting → Connected →
// Closed, or Connecting → Closed.
const (
	// ServerPathConnecting: connections are being added; the path has not
	// completed session establishment (INFO_REQ on cid 0) and serves
	// nothing.
	ServerPathConnecting ServerPathState = iota
	// ServerPathConnected: INFO_REQ processed; the path serves IO.
	ServerPathConnected
	// ServerPathClosed: the path was closed and left its session. Its
	// requests that have not started yet never start.
	ServerPathClosed
)

// String returns the kernel-style name of s.
func (s ServerPathState) String() string {
	switch s {
	case ServerPathConnecting:
		return "CONNECTING"
	case ServerPathConnected:
		return "CONNECTED"
	case ServerPathClosed:
		return "CLOSED"
	}
	return "UNKNOWN"
}

// PathOwner is the transport's side of a server path: what the session
// layer needs to end it (an establishment deadline passed, the server
// closes).
type PathOwner interface {
	// ClosePath closes every connection of the path and then calls
	// ServerTable.ClosePath. It may be called more than once and from any
	// goroutine.
	ClosePath()
}

// ServerSession is one client session on a server: the paths that share a
// paths_uuid, its name, and its chunk pool. Its lifetime is the session
// layer's (ServerTable): it starts with the first connection of its first
// path, and it is released once its last path has been gone for the
// table's linger time; then its name is free, its upper-layer state is
// dropped (ServerTableConfig.OnRelease) and its pool is unmapped once no
// request holds it.
type ServerSession struct {
	t         *ServerTable
	pathsUUID UUID
	// name is written once, under t.mu, before the first path turns
	// Connected; a path's state is stored after it, so whoever saw the
	// path Connected reads the name without a lock.
	name string
	// id is who every path of the session is, fixed by the first path
	// established (authSet).
	id       identity
	authSet  bool
	paths    []*ServerPath
	pool     []byte
	poolSize int
	state    sessionState
	linger   *time.Timer
	hooks    []func() // transport resources to free before the pool (under t.mu)
	inflight atomic.Int64
	gone     atomic.Bool   // released: out of the table
	released chan struct{} // closed when the release is done with it
}

// Released reports whether the session was released: it has no path and
// never will again, and the upper layer must not attach state to it.
func (s *ServerSession) Released() bool { return s.gone.Load() }

type sessionState int

const (
	sessionOpen      sessionState = iota // has paths
	sessionLingering                     // no path; may come back until linger ends
	sessionReleased                      // gone from the table
)

// Name returns the session name, "" before its first path completed
// establishment.
func (s *ServerSession) Name() string { return s.name }

// PathsUUID returns the session's paths_uuid.
func (s *ServerSession) PathsUUID() UUID { return s.pathsUUID }

// Pool returns the session's chunk pool: queue_depth chunks, mmap'd
// anonymous memory that the session layer unmaps only when no request
// holds it (Hold).
func (s *ServerSession) Pool() []byte { return s.pool }

// Hold records a request that uses the session's pool (its chunk, its
// device state) from now until the matching Release. A session is not
// freed while requests hold it.
func (s *ServerSession) Hold() { s.inflight.Add(1) }

// Release ends a Hold.
func (s *ServerSession) Release() { s.inflight.Add(-1) }

// OnFree registers fn to run when the session's pool is about to be freed
// (after every request released it): a transport deregisters its memory
// registrations there. It must be called before the session's first path
// is established (from within ServerTable.Attach's newOwner, typically).
func (s *ServerSession) OnFree(fn func()) {
	s.t.mu.Lock()
	s.hooks = append(s.hooks, fn)
	s.t.mu.Unlock()
}

// ServerPath is one path of a server session: cid_num connections that
// share a sess_uuid.
type ServerPath struct {
	sess     *ServerSession
	sessUUID UUID
	cidNum   int
	cids     []bool
	state    atomic.Int32 // ServerPathState
	src, dst netip.AddrPort
	reconCnt uint16
	owner    PathOwner
	deadline *time.Timer // establishment
	// key is the key the path must prove (nil: it does not authenticate),
	// auth what its proofs cover; cert is the name of the certificate its
	// connections showed (TLS), "" for none.
	key  *Key
	auth PathAuth
	cert string
}

// identity is who a path is: the key it proved and the certificate it
// showed, by name ("" for none).
type identity struct{ key, cert string }

func (id identity) String() string {
	return fmt.Sprintf("key %q, certificate %q", id.key, id.cert)
}

// name returns the key's name, "" for no key.
func (k *Key) name() string {
	if k == nil {
		return ""
	}
	return k.Name
}

// Identity returns the name of the key the session's paths proved, ""
// when they did not authenticate (or before the first is established).
func (s *ServerSession) Identity() string {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.id.key
}

// CertName returns the name of the client certificate the session's
// paths showed (TLS), "" for none.
func (s *ServerSession) CertName() string {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.id.cert
}

// AddAuth adds what the connection response to connection cid of p says
// of authentication: FlagAuth on a path that authenticates, and on cid 0
// the server nonce.
func (p *ServerPath) AddAuth(rsp *ConnRsp, cid uint16) {
	if p.key == nil {
		return
	}
	rsp.Flags |= FlagAuth
	if cid == 0 {
		rsp.Nonce = p.auth.ServerNonce
	}
}

// AddProof adds the server's proof to the INFO_RSP of an established path
// that authenticates.
func (p *ServerPath) AddProof(rsp *InfoRsp) {
	if p.key == nil {
		return
	}
	rsp.Auth = true
	rsp.Proof = p.auth.ServerProof(p.key)
}

// Session returns the session p belongs to.
func (p *ServerPath) Session() *ServerSession { return p.sess }

// SessUUID returns the path's sess_uuid.
func (p *ServerPath) SessUUID() UUID { return p.sessUUID }

// CIDNum returns the number of connections of the path.
func (p *ServerPath) CIDNum() int { return p.cidNum }

// Owner returns the transport's side of the path.
func (p *ServerPath) Owner() PathOwner { return p.owner }

// Src and Dst return the client and server address of the path's first
// connection.
func (p *ServerPath) Src() netip.AddrPort { return p.src }

// Dst: see Src.
func (p *ServerPath) Dst() netip.AddrPort { return p.dst }

// State returns the path's state.
func (p *ServerPath) State() ServerPathState { return ServerPathState(p.state.Load()) }

// Serving reports whether the path may start requests: it completed
// session establishment and is not closed. Transports ask before every
// request they hand to the upper layer, so that no IO and no OPEN runs on
// a path that never sent INFO_REQ, and no request that a closed path had
// left unread runs after its resend.
func (p *ServerPath) Serving() bool { return p.state.Load() == int32(ServerPathConnected) }

// PeerAddrs returns the source addresses of the session's paths, one per
// path (a session lingering without paths has none).
func (s *ServerSession) PeerAddrs() []netip.Addr {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	out := make([]netip.Addr, 0, len(s.paths))
	for _, p := range s.paths {
		out = append(out, p.src.Addr().Unmap())
	}
	return out
}
