package rtrs

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
)

type nopOwner struct{}

func (nopOwner) ClosePath() {}

func testKey(t *testing.T, name string) *Key {
	t.Helper()
	k, err := GenerateKey(name)
	mustNoErr(t, err)
	return &k
}

var (
	authSrc = netip.MustParseAddrPort("127.0.0.2:40000")
	authDst = netip.MustParseAddrPort("127.0.0.1:1234")
)

// authTable returns a table that knows keys and requires authentication
// if required.
func authTable(t *testing.T, required bool, keys ...*Key) *ServerTable {
	var ks []Key
	for _, k := range keys {
		ks = append(ks, *k)
	}
	ring, err := NewKeyRing(ks)
	mustNoErr(t, err)
	tab := NewServerTable(ServerTableConfig{Logf: t.Logf, Linger: -1, Auth: ServerAuth{Keys: ring, Required: required}})
	t.Cleanup(tab.Close)
	return tab
}

// clientPath is the client's side of one path connect in these tests.
type clientPath struct {
	src   netip.AddrPort
	auth  *ClientAuth
	reqs  []ConnReq
	paths UUID
	sess  UUID
}

func newClientPath(k *Key, paths, sess byte) *clientPath {
	return &clientPath{src: authSrc, auth: NewClientAuth(k), paths: UUID{paths}, sess: UUID{sess}}
}

// connect runs the ConnReq/ConnRsp of cids 0..cidNum-1 against tab as a
// transport would; it returns the server path and the first error.
func (c *clientPath) connect(tab *ServerTable, cidNum int) (*ServerPath, error) {
	var path *ServerPath
	for cid := 0; cid < cidNum; cid++ {
		req := ConnReq{CID: uint16(cid), CIDNum: uint16(cidNum), SessUUID: c.sess, PathsUUID: c.paths, FirstConn: true}
		c.auth.AddToConnReq(&req)
		c.reqs = append(c.reqs, req)
		p, err := tab.Attach(&req, c.src, authDst, 4096, func(*ServerPath) PathOwner { return nopOwner{} })
		if err != nil {
			return path, err
		}
		path = p
		rsp := ConnRsp{QueueDepth: 1}
		p.AddAuth(&rsp, req.CID)
		if err := c.auth.CheckConnRsp(&req, &rsp); err != nil {
			return path, err
		}
	}
	return path, nil
}

// establish runs INFO_REQ/INFO_RSP.
func (c *clientPath) establish(tab *ServerTable, p *ServerPath, name string) error {
	var req InfoReq
	mustNoErrAny(req.SetName(name))
	c.auth.AddToInfoReq(&req)
	if err := tab.Establish(p, &req); err != nil {
		return err
	}
	rsp := InfoRsp{Desc: []SGDesc{{Len: 4096}}}
	p.AddProof(&rsp)
	return c.auth.CheckInfoRsp(&rsp)
}

func mustNoErrAny(err error) {
	if err != nil {
		panic(err)
	}
}

func TestAuthPathProvesItsKey(t *testing.T) {
	alice, bob := testKey(t, "alice"), testKey(t, "bob@host-1")
	tab := authTable(t, true, alice, bob)
	c := newClientPath(alice, 1, 1)
	p, err := c.connect(tab, 3)
	mustNoErr(t, err)
	mustNoErr(t, c.establish(tab, p, "s1"))
	if !p.Serving() || p.Session().Identity() != "alice" {
		t.Fatalf("serving %v identity %q", p.Serving(), p.Session().Identity())
	}
	// A second path of the session must prove the same key.
	c2 := newClientPath(bob, 1, 2)
	if _, err := c2.connect(tab, 3); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("path with another key: %v, want EACCES", err)
	}
	c3 := newClientPath(alice, 1, 3)
	c3.src = netip.MustParseAddrPort("127.0.0.3:40000")
	p3, err := c3.connect(tab, 3)
	mustNoErr(t, err)
	mustNoErr(t, c3.establish(tab, p3, "s1"))
}

func TestAuthRefusals(t *testing.T) {
	alice := testKey(t, "alice")
	tab := authTable(t, true, alice)

	// A client without a key (a kernel client): refused at cid 0.
	if _, err := newClientPath(nil, 1, 1).connect(tab, 2); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("no key: %v, want EACCES", err)
	}
	// An unknown key: refused at cid 0.
	if _, err := newClientPath(testKey(t, "mallory"), 2, 1).connect(tab, 2); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("unknown key: %v, want EACCES", err)
	}
	if tab.Sessions() != 0 {
		t.Fatalf("%d sessions held after refusals at cid 0, want none", tab.Sessions())
	}
	// The right name with another secret: the key id passes, cid 1's
	// proof does not.
	forged := &Key{Name: "alice", Secret: []byte("0123456789abcdef")}
	c := newClientPath(forged, 3, 1)
	if _, err := c.connect(tab, 2); !errors.Is(err, syscall.EACCES) || len(c.reqs) != 2 {
		t.Fatalf("forged secret: %v after %d requests, want EACCES at cid 1", err, len(c.reqs))
	}
	// ... and with only cid 0, at INFO_REQ.
	c = newClientPath(forged, 4, 1)
	p, err := c.connect(tab, 1)
	mustNoErr(t, err)
	if err := c.establish(tab, p, "s4"); !errors.Is(err, syscall.EACCES) || p.Serving() {
		t.Fatalf("forged secret at INFO_REQ: %v (serving %v), want EACCES", err, p.Serving())
	}
	// A path that starts with cid 1 cannot skip cid 0's nonce.
	req := ConnReq{CID: 1, CIDNum: 2, SessUUID: UUID{9}, PathsUUID: UUID{9}, FirstConn: true, Auth: true}
	if _, err := tab.Attach(&req, authSrc, authDst, 4096, func(*ServerPath) PathOwner { return nopOwner{} }); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("path from cid 1: %v, want EACCES", err)
	}
}

// A recorded handshake replayed: the server's nonce is new for every
// path, so neither the connections' proofs nor the path's proof fit.
func TestAuthReplayRefused(t *testing.T) {
	alice := testKey(t, "alice")
	tab := authTable(t, true, alice)
	c := newClientPath(alice, 1, 1)
	p, err := c.connect(tab, 2)
	mustNoErr(t, err)
	var info InfoReq
	mustNoErrAny(info.SetName("s1"))
	c.auth.AddToInfoReq(&info)
	mustNoErr(t, tab.Establish(p, &info))
	tab.ClosePath(p)

	// Replay cid 0 (accepted: it carries only the key id), then cid 1.
	owner := func(*ServerPath) PathOwner { return nopOwner{} }
	p2, err := tab.Attach(&c.reqs[0], authSrc, authDst, 4096, owner)
	mustNoErr(t, err)
	if _, err := tab.Attach(&c.reqs[1], authSrc, authDst, 4096, owner); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("replayed cid 1: %v, want EACCES", err)
	}
	if err := tab.Establish(p2, &info); !errors.Is(err, syscall.EACCES) || p2.Serving() {
		t.Fatalf("replayed INFO_REQ: %v, want EACCES", err)
	}
}

func TestAuthNotRequired(t *testing.T) {
	alice := testKey(t, "alice")
	tab := authTable(t, false, alice)
	c := newClientPath(nil, 1, 1)
	p, err := c.connect(tab, 2)
	mustNoErr(t, err)
	mustNoErr(t, c.establish(tab, p, "anon"))
	if p.Session().Identity() != "" {
		t.Fatalf("identity %q, want none", p.Session().Identity())
	}
	// An authenticated path cannot join the unauthenticated session.
	if _, err := newClientPath(alice, 1, 2).connect(tab, 2); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("keyed path into keyless session: %v, want EACCES", err)
	}
}

// The client refuses a server that does not authenticate, or proves
// another key: no silent downgrade.
func TestAuthClientChecksServer(t *testing.T) {
	alice := testKey(t, "alice")
	plain := NewServerTable(ServerTableConfig{Logf: t.Logf, Linger: -1})
	t.Cleanup(plain.Close)
	if _, err := newClientPath(alice, 1, 1).connect(plain, 2); !errors.Is(err, ErrServerNoAuth) || !errors.Is(err, syscall.EPROTONOSUPPORT) {
		t.Fatalf("server without auth: %v, want ErrServerNoAuth", err)
	}
	a := NewClientAuth(alice)
	req := ConnReq{CIDNum: 1}
	a.AddToConnReq(&req)
	mustNoErr(t, a.CheckConnRsp(&req, &ConnRsp{QueueDepth: 1, Flags: FlagAuth, Nonce: NewNonce()}))
	var info InfoReq
	mustNoErrAny(info.SetName("s"))
	a.AddToInfoReq(&info)
	if err := a.CheckInfoRsp(&InfoRsp{Auth: true}); !errors.Is(err, ErrServerProof) {
		t.Fatalf("wrong server proof: %v", err)
	}
	if err := a.CheckInfoRsp(&InfoRsp{}); !errors.Is(err, ErrServerProof) {
		t.Fatalf("missing server proof: %v", err)
	}
}

func TestKeyChecks(t *testing.T) {
	for _, k := range []Key{
		{Name: "", Secret: make([]byte, 16)},
		{Name: strings.Repeat("a", MaxKeyName+1), Secret: make([]byte, 16)},
		{Name: "a b", Secret: make([]byte, 16)},
		{Name: "a", Secret: make([]byte, 15)},
	} {
		if err := k.Check(); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%q with %d-byte secret: %v", k.Name, len(k.Secret), err)
		}
	}
	a := testKey(t, "a")
	if _, err := NewKeyRing([]Key{*a, *a}); err == nil {
		t.Fatal("key ring with a key twice")
	}
	if testKey(t, "a").ID() != a.ID() || testKey(t, "b").ID() == a.ID() {
		t.Fatal("key ids do not follow names")
	}
	// ExplainRefusal says what an EACCES means.
	err := ExplainRefusal(syscall.EACCES, nil)
	if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "requires authentication") {
		t.Fatal(err)
	}
	if err := ExplainRefusal(syscall.EACCES, a); !strings.Contains(err.Error(), `refused key "a"`) {
		t.Fatal(err)
	}
}
