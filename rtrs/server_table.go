package rtrs

import (
	"fmt"
	"log"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of ServerTableConfig.
const (
	// DefaultMaxSessions bounds the sessions a server holds at once.
	DefaultMaxSessions = 256
	// DefaultMaxConnsPerPeer bounds the connections of one client
	// address, in handshake or established: a path of a host with 64 CPUs
	// and 8 devices mapped is 513 connections.
	DefaultMaxConnsPerPeer = 2048
	// DefaultMaxHandshakes bounds the handshakes running at once.
	DefaultMaxHandshakes = 128
	// DefaultLinger is how long a session whose last path went is kept,
	// so that the client's reconnect finds it.
	DefaultLinger = 10 * time.Second
)

// ServerTableConfig sets the limits of a ServerTable.
type ServerTableConfig struct {
	// MaxSessions is the most sessions held at once, lingering ones
	// included; a new one beyond is refused with ENOSPC. 0:
	// DefaultMaxSessions.
	MaxSessions int
	// MaxConnsPerPeer is the most connections one client IP address holds
	// at once; one beyond is refused with EBUSY. 0: DefaultMaxConnsPerPeer.
	MaxConnsPerPeer int
	// MaxHandshakes is the most connections in their handshake at once;
	// one beyond is refused with EBUSY. 0: DefaultMaxHandshakes.
	MaxHandshakes int
	// MaxMemory is the most bytes of chunk pools over all sessions; a new
	// session beyond is refused with ENOMEM. 0: no limit.
	MaxMemory int64
	// Linger is how long a session without paths is kept before it is
	// released (0: DefaultLinger; negative: released at once). Another
	// session that claims its name releases it at once.
	Linger time.Duration
	// EstablishTimeout is how long a path may stay CONNECTING (connections
	// up, no INFO_REQ) before it is closed. 0: ConnectTimeout.
	EstablishTimeout time.Duration
	// DrainTimeout is how long a released session waits for requests that
	// still hold its pool (a backend request that does not return); after
	// it the pool is leaked, never freed, and a line is logged. 0:
	// ConnectTimeout.
	DrainTimeout time.Duration
	// OnRelease, if set, is called once for every released session (from
	// a goroutine of its own, before the pool is freed): the upper layer
	// drops what it holds for the session (RNBD: its devices).
	OnRelease func(*ServerSession)
	// Logf receives a line for every refusal and release; nil: log.Printf.
	Logf func(format string, args ...any)
	// Auth is the server's authentication (auth.go); SetAuth changes it.
	Auth ServerAuth
}

// ServerAuth says how a server authenticates clients.
type ServerAuth struct {
	// Keys are the keys clients may prove; with none the server offers no
	// authentication and takes every client unauthenticated.
	Keys *KeyRing
	// Required refuses (EACCES) a client that does not authenticate, a
	// kernel client for one. Without it such a client is taken with no
	// identity, and the upper layer's policy decides what it may open.
	Required bool
}

// ServerTable is the session layer of an RTRS server, shared by its
// transports (one table can serve TCP and RDMA listeners at once, so a
// session name is unique across them). It applies the kernel's session and
// path rules to connection requests and INFO_REQs, keeps each path's state,
// admits connections within the configured limits, and releases sessions:
// each rule written once, whatever the transport.
type ServerTable struct {
	cfg ServerTableConfig

	mu         sync.Mutex
	auth       ServerAuth
	byUUID     map[UUID]*ServerSession
	byName     map[string]*ServerSession
	peers      map[netip.Addr]int
	handshakes int
	memory     int64 // pool bytes held, leaked pools included
	leaked     int64
	closed     bool
	releasing  sync.WaitGroup
}

// NewServerTable returns a table with cfg's limits, defaults filled in.
func NewServerTable(cfg ServerTableConfig) *ServerTable {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxConnsPerPeer <= 0 {
		cfg.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = DefaultMaxHandshakes
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.EstablishTimeout <= 0 {
		cfg.EstablishTimeout = ConnectTimeout
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = ConnectTimeout
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return &ServerTable{cfg: cfg, byUUID: map[UUID]*ServerSession{}, byName: map[string]*ServerSession{},
		peers: map[netip.Addr]int{}, auth: cfg.Auth}
}

// SetAuth replaces the table's authentication, for connections that come
// from now on: established paths keep the key they proved (the upper
// layer's policy, reloaded with it, decides whether their sessions stay).
func (t *ServerTable) SetAuth(a ServerAuth) {
	t.mu.Lock()
	t.auth = a
	t.mu.Unlock()
}

// checkAuth applies the authentication rules to connection req of a new
// path (cid 0) or of path (other cids); t.mu is held. For a new path it
// returns the key the path must prove.
func (t *ServerTable) checkAuth(req *ConnReq, path *ServerPath, src netip.AddrPort) (*Key, error) {
	if path != nil { // a later cid of the path
		if path.key == nil {
			return nil, nil
		}
		if !req.Auth {
			return nil, refuse(syscall.EACCES, "path %x cid %d: no proof on a path that authenticates", req.SessUUID, req.CID)
		}
		want := ConnProof(path.key, &path.auth.ServerNonce, req)
		if !proofEqual(want[:], req.AuthData[:]) {
			t.logf("auth: %v path %x cid %d: wrong connection proof for key %q: %v", src, req.SessUUID, req.CID, path.key.Name, syscall.EACCES)
			return nil, refuse(syscall.EACCES, "cid %d: wrong proof", req.CID)
		}
		return path.key, nil
	}
	if t.auth.Keys.Len() == 0 || !req.Auth {
		if t.auth.Required {
			t.logf("auth: %v refused: the client does not authenticate (a kernel client, or no key given): %v", src, syscall.EACCES)
			return nil, refuse(syscall.EACCES, "authentication required")
		}
		return nil, nil
	}
	if req.CID != 0 {
		return nil, refuse(syscall.EACCES, "an authenticating path starts with cid 0, not %d", req.CID)
	}
	k := t.auth.Keys.Lookup(req.KeyID())
	if k == nil {
		t.logf("auth: %v refused: unknown key id %x: %v", src, req.KeyID(), syscall.EACCES)
		return nil, refuse(syscall.EACCES, "unknown key")
	}
	return k, nil
}

// Config returns the table's configuration with defaults filled in.
func (t *ServerTable) Config() ServerTableConfig { return t.cfg }

func (t *ServerTable) logf(format string, args ...any) { t.cfg.Logf("rtrs server: "+format, args...) }

// ConnSlot is one admitted connection: it counts toward its peer's
// connections until Close, and toward the running handshakes until
// HandshakeDone or Close.
type ConnSlot struct {
	t          *ServerTable
	peer       netip.Addr
	handshake  bool
	registered bool
}

// Admit admits a new connection from peer, before its handshake. It fails
// (wrapping EBUSY) when MaxHandshakes handshakes run or peer holds
// MaxConnsPerPeer connections, or (ECONNRESET) when the table is closed.
func (t *ServerTable) Admit(peer netip.Addr) (*ConnSlot, error) {
	peer = peer.Unmap()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, fmt.Errorf("server closing: %w", syscall.ECONNRESET)
	case t.handshakes >= t.cfg.MaxHandshakes:
		t.logf("connection from %v refused: %d handshakes running (limit): %v", peer, t.handshakes, syscall.EBUSY)
		return nil, fmt.Errorf("%d handshakes running, the limit: %w", t.handshakes, syscall.EBUSY)
	case t.peers[peer] >= t.cfg.MaxConnsPerPeer:
		t.logf("connection from %v refused: it holds %d connections (limit): %v", peer, t.peers[peer], syscall.EBUSY)
		return nil, fmt.Errorf("peer %v holds %d connections, the limit: %w", peer, t.peers[peer], syscall.EBUSY)
	}
	t.handshakes++
	t.peers[peer]++
	return &ConnSlot{t: t, peer: peer, handshake: true, registered: true}, nil
}

// HandshakeDone ends the slot's handshake; the connection still counts
// toward its peer.
func (c *ConnSlot) HandshakeDone() {
	c.t.mu.Lock()
	if c.handshake {
		c.handshake = false
		c.t.handshakes--
	}
	c.t.mu.Unlock()
}

// Close gives the slot back. It may be called more than once.
func (c *ConnSlot) Close() {
	if c == nil {
		return
	}
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	if c.handshake {
		c.handshake = false
		c.t.handshakes--
	}
	if c.registered {
		c.registered = false
		if c.t.peers[c.peer]--; c.t.peers[c.peer] <= 0 {
			delete(c.t.peers, c.peer)
		}
	}
}

// RefusalError is a refused connection request: Errno is what the server
// answers in its ConnRsp (errors.Is(err, syscall.ENXIO) works).
type RefusalError struct {
	Errno  syscall.Errno
	Reason string
}

func (e *RefusalError) Error() string {
	return fmt.Sprintf("%s: %v", e.Reason, e.Errno)
}

// Unwrap returns the errno.
func (e *RefusalError) Unwrap() error { return e.Errno }

func refuse(errno syscall.Errno, format string, args ...any) error {
	return &RefusalError{Errno: errno, Reason: fmt.Sprintf(format, args...)}
}

// Attach applies the kernel's session and path checks to the connection
// request req that came from src to dst and, if they pass, records the
// connection in its path, creating the session (with a chunk pool of
// poolSize bytes) and the path as needed. newOwner makes the transport's
// side of a new path. A refusal is a *RefusalError carrying the errno to
// answer: ENXIO (unknown session without first_conn), ECONNRESET (path not
// CONNECTING, cid_num differs, cid taken, too many paths, another pool
// size), EEXIST (another path of the session joins the same addresses),
// ENOSPC (MaxSessions), ENOMEM (MaxMemory, or mmap failed).
func (t *ServerTable) Attach(req *ConnReq, src, dst netip.AddrPort, poolSize int, newOwner func(*ServerPath) PathOwner) (*ServerPath, error) {
	return t.AttachCert(req, src, dst, "", poolSize, newOwner)
}

// AttachCert is Attach for a connection whose transport identified the
// client by a certificate named cert (TLS; "" for none): every connection
// of a path, and every path of a session, must carry the same (EACCES).
func (t *ServerTable) AttachCert(req *ConnReq, src, dst netip.AddrPort, cert string, poolSize int, newOwner func(*ServerPath) PathOwner) (*ServerPath, error) {
	if req.CIDNum == 0 || req.CID >= req.CIDNum || req.CIDNum > MaxConnsPerPath {
		return nil, refuse(syscall.ECONNRESET, "cid %d of %d", req.CID, req.CIDNum)
	}
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, refuse(syscall.ECONNRESET, "server closing")
	}
	sess := t.byUUID[req.PathsUUID]
	var path *ServerPath
	if sess != nil {
		for _, p := range sess.paths {
			if p.sessUUID == req.SessUUID {
				path = p
				break
			}
		}
	}
	var key *Key // the key a new path must prove
	if path == nil {
		// Checked before a session and its pool are made for the request.
		var err error
		if key, err = t.checkAuth(req, nil, src); err != nil {
			return nil, err
		}
	}
	if sess == nil {
		if !req.FirstConn {
			return nil, refuse(syscall.ENXIO, "no session %x and first_conn not set", req.PathsUUID)
		}
		if len(t.byUUID) >= t.cfg.MaxSessions {
			t.logf("session from %v refused: %d sessions (limit): %v", src, len(t.byUUID), syscall.ENOSPC)
			return nil, refuse(syscall.ENOSPC, "%d sessions, the limit", len(t.byUUID))
		}
		if t.cfg.MaxMemory > 0 && t.memory+int64(poolSize) > t.cfg.MaxMemory {
			t.logf("session from %v refused: chunk pools hold %d of %d bytes, a new one needs %d: %v",
				src, t.memory, t.cfg.MaxMemory, poolSize, syscall.ENOMEM)
			return nil, refuse(syscall.ENOMEM, "memory budget of %d bytes for chunk pools used up", t.cfg.MaxMemory)
		}
		pool, err := unix.Mmap(-1, 0, (poolSize+4095)&^4095, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			t.logf("session from %v refused: mmap of %d bytes: %v", src, poolSize, err)
			return nil, refuse(syscall.ENOMEM, "mmap %d bytes: %v", poolSize, err)
		}
		t.memory += int64(len(pool))
		sess = &ServerSession{t: t, pathsUUID: req.PathsUUID, pool: pool[:poolSize], poolSize: poolSize,
			released: make(chan struct{})}
		t.byUUID[req.PathsUUID] = sess
	} else if sess.poolSize != poolSize {
		return nil, refuse(syscall.ECONNRESET, "session %x has chunk pool of %d bytes, not %d", req.PathsUUID, sess.poolSize, poolSize)
	}
	if path != nil {
		if path.State() != ServerPathConnecting || path.cidNum != int(req.CIDNum) || path.cids[req.CID] {
			return nil, refuse(syscall.ECONNRESET, "path %x: cid %d of %d not expected", req.SessUUID, req.CID, req.CIDNum)
		}
		if _, err := t.checkAuth(req, path, src); err != nil {
			return nil, err
		}
		if path.cert != cert {
			t.logf("auth: %v refused: cid %d of path %x shows certificate %q, the path's cid 0 %q: %v", src, req.CID, req.SessUUID, cert, path.cert, syscall.EACCES)
			return nil, refuse(syscall.EACCES, "another certificate than the path's")
		}
	} else {
		if id := (identity{key.name(), cert}); sess.authSet && sess.id != id {
			t.dropIfEmpty(sess)
			t.logf("auth: %v refused: path of session %x is %v, the session's paths %v: %v", src, req.PathsUUID, id, sess.id, syscall.EACCES)
			return nil, refuse(syscall.EACCES, "another identity than the session's")
		}
		if len(sess.paths) >= MaxPathsNum {
			t.dropIfEmpty(sess)
			return nil, refuse(syscall.ECONNRESET, "session has %d paths", len(sess.paths))
		}
		for _, p := range sess.paths {
			if p.src.Addr() == src.Addr() && p.dst == dst {
				return nil, refuse(syscall.EEXIST, "another path of the session joins %v and %v", src.Addr(), dst)
			}
		}
		path = &ServerPath{sess: sess, sessUUID: req.SessUUID, cidNum: int(req.CIDNum), cids: make([]bool, req.CIDNum), src: src, dst: dst, key: key, cert: cert}
		if key != nil {
			path.auth = PathAuth{ServerNonce: NewNonce(), Req: *req}
		}
		path.owner = newOwner(path)
		sess.paths = append(sess.paths, path)
		if sess.state == sessionLingering {
			sess.linger.Stop()
			sess.state = sessionOpen
		}
		path.deadline = time.AfterFunc(t.cfg.EstablishTimeout, func() {
			if path.State() == ServerPathConnecting {
				t.logf("path %v → %v closed: no INFO_REQ within %v", path.src, path.dst, t.cfg.EstablishTimeout)
				path.owner.ClosePath()
			}
		})
	}
	path.reconCnt = req.ReconCnt
	path.cids[req.CID] = true
	return path, nil
}

// dropIfEmpty releases a session made by the current Attach that ends up
// with no path; t.mu is held.
func (t *ServerTable) dropIfEmpty(sess *ServerSession) {
	if len(sess.paths) == 0 && sess.state == sessionOpen {
		t.startRelease(sess)
	}
}

// Establish handles the INFO_REQ of path p, which names the session: no
// other session may hold the name (EPERM) — one that has no path left is
// released first —, and a session keeps the name of its first path
// (EPERM). On success p is Connected and serves requests. Errors wrap the
// errno the kernel would answer.
//
// On a path that authenticates, req must carry the client's proof (else
// EACCES), and the session's paths must all prove the same key: the
// first establishes the session's identity (ServerSession.Identity).
func (t *ServerTable) Establish(p *ServerPath, req *InfoReq) error {
	name := req.NameString()
	if err := CheckSessName(name); err != nil {
		return fmt.Errorf("session name: %w", syscall.EINVAL)
	}
	if p.key != nil {
		p.auth.Name = name
		p.auth.ClientNonce = req.ClientNonce
		want := p.auth.ClientProof(p.key)
		if !req.Auth || !proofEqual(want[:], req.Proof[:]) {
			t.logf("auth: %v session %q refused: wrong or missing path proof for key %q: %v", p.src, name, p.key.Name, syscall.EACCES)
			return fmt.Errorf("path proof for key %q: %w", p.key.Name, syscall.EACCES)
		}
	}
	for {
		t.mu.Lock()
		sess := p.sess
		if p.State() != ServerPathConnecting {
			t.mu.Unlock()
			return fmt.Errorf("path closed: %w", syscall.ECONNRESET)
		}
		if sess.name != "" && sess.name != name {
			t.mu.Unlock()
			return fmt.Errorf("session is named %q, not %q: %w", sess.name, name, syscall.EPERM)
		}
		other := t.byName[name]
		if other != nil && other != sess {
			if len(other.paths) > 0 {
				t.mu.Unlock()
				return fmt.Errorf("session name %q is in use: %w", name, syscall.EPERM)
			}
			// Its owner left: release it, then claim the name.
			t.startRelease(other)
			t.mu.Unlock()
			<-other.released
			continue
		}
		if id := (identity{p.key.name(), p.cert}); sess.authSet && sess.id != id {
			t.mu.Unlock()
			return fmt.Errorf("path is %v, the session's paths %v: %w", id, sess.id, syscall.EACCES)
		}
		if sess.name == "" {
			// Written once: the serving paths read it without a lock
			// (a later path's rewrite of the same name raced them).
			sess.name = name
		}
		sess.id, sess.authSet = identity{p.key.name(), p.cert}, true
		t.byName[name] = sess
		p.deadline.Stop()
		p.state.Store(int32(ServerPathConnected))
		t.mu.Unlock()
		return nil
	}
}

// FencePath finds the path of from's session whose sess_uuid is target,
// for a FenceReq that from carried: the caller closes it (its transport's
// ClosePath, which calls ClosePath here first) before it answers. A
// session fences only its own paths, from a path that serves, and not
// the path it asks on (EINVAL); nil and no error when the path is gone
// already.
func (t *ServerTable) FencePath(from *ServerPath, target UUID) (*ServerPath, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !from.Serving() {
		return nil, fmt.Errorf("fence on a path that does not serve: %w", syscall.ECONNRESET)
	}
	if target == from.sessUUID {
		return nil, fmt.Errorf("a path cannot fence itself: %w", syscall.EINVAL)
	}
	for _, p := range from.sess.paths {
		if p.sessUUID == target {
			return p, nil
		}
	}
	return nil, nil
}

// ClosePath takes p out of its session: p stops serving at once. It
// reports whether this call closed it. When p was the session's last path,
// the session lingers and is released after the linger time, unless a
// path joins it again.
func (t *ServerTable) ClosePath(p *ServerPath) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.State() == ServerPathClosed {
		return false
	}
	p.state.Store(int32(ServerPathClosed))
	if p.deadline != nil {
		p.deadline.Stop()
	}
	sess := p.sess
	for i, o := range sess.paths {
		if o == p {
			sess.paths = append(sess.paths[:i], sess.paths[i+1:]...)
			break
		}
	}
	if len(sess.paths) > 0 || sess.state != sessionOpen {
		return true
	}
	if t.cfg.Linger < 0 || sess.name == "" || t.closed {
		t.startRelease(sess)
		return true
	}
	sess.state = sessionLingering
	sess.linger = time.AfterFunc(t.cfg.Linger, func() {
		t.mu.Lock()
		if sess.state == sessionLingering {
			t.startRelease(sess)
		}
		t.mu.Unlock()
	})
	return true
}

// startRelease takes sess out of the table and frees it in the background;
// t.mu is held.
func (t *ServerTable) startRelease(sess *ServerSession) {
	if sess.state == sessionReleased {
		return
	}
	if sess.linger != nil {
		sess.linger.Stop()
	}
	sess.state = sessionReleased
	sess.gone.Store(true)
	if t.byUUID[sess.pathsUUID] == sess {
		delete(t.byUUID, sess.pathsUUID)
	}
	if sess.name != "" && t.byName[sess.name] == sess {
		delete(t.byName, sess.name)
	}
	t.releasing.Add(1)
	go t.release(sess)
}

// release drops the upper layer's state of sess, waits until no request
// holds it, and frees the transports' resources and the pool; a pool still
// held after DrainTimeout is leaked.
func (t *ServerTable) release(sess *ServerSession) {
	defer t.releasing.Done()
	defer close(sess.released)
	if t.cfg.OnRelease != nil && sess.name != "" {
		t.cfg.OnRelease(sess)
	}
	deadline := time.Now().Add(t.cfg.DrainTimeout)
	for sess.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			t.mu.Lock()
			t.leaked += int64(cap(sess.pool))
			t.mu.Unlock()
			t.logf("session %q: %d requests still hold its chunk pool after %v; its %d bytes are leaked, not freed",
				sess.name, sess.inflight.Load(), t.cfg.DrainTimeout, cap(sess.pool))
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.mu.Lock()
	hooks := sess.hooks
	sess.hooks = nil
	t.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
	n := cap(sess.pool)
	if n > 0 {
		_ = unix.Munmap(sess.pool[:n])
	}
	t.mu.Lock()
	t.memory -= int64(n)
	t.mu.Unlock()
}

// Sessions returns the number of sessions held (lingering ones included).
func (t *ServerTable) Sessions() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byUUID)
}

// Memory returns the bytes of chunk pools held, and of those the bytes
// leaked.
func (t *ServerTable) Memory() (held, leaked int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.memory, t.leaked
}

// Lookup returns the session named name, or nil.
func (t *ServerTable) Lookup(name string) *ServerSession {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byName[name]
}

// Close refuses new connections and releases every session that has no
// path; the transports close theirs (which releases the rest), then Wait.
func (t *ServerTable) Close() {
	t.mu.Lock()
	t.closed = true
	for _, sess := range t.byUUID {
		if len(sess.paths) == 0 {
			t.startRelease(sess)
		}
	}
	t.mu.Unlock()
}

// Wait waits for the releases under way.
func (t *ServerTable) Wait() { t.releasing.Wait() }
