package rtrs

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"syscall"
)

// Authentication (a urnbd extension, on both transports): a client proves
// that it holds a pre-shared key before its path may serve anything, the
// server proves it holds the same key, and the key never goes on the wire.
// It rides in fields the kernel leaves reserved and ignores, and is
// negotiated: a client offers it only when it has a key, a server answers
// it only when offered, so a kernel peer on either side sees the plain
// protocol. The exchange, per path connect:
//
//	cid 0 ConnReq   Auth, key id (8 bytes: KeyID)
//	cid 0 ConnRsp   FlagAuth, server nonce Ns (16 random bytes, new for
//	                every path the server creates)
//	cid i ConnReq   Auth, ConnProof(key, Ns, the request): 11 bytes
//	cid i ConnRsp   FlagAuth (the proof was checked)
//	INFO_REQ        + InfoAuth trailer: client nonce Nc and the client's
//	                PathProof over Ns, Nc, the path's uuids and cid_num and
//	                the session name
//	INFO_RSP        + trailer: the server's PathProof over the same
//
// The server checks each connection's proof when it arrives and the path's
// proof before the path serves (ServerTable.Establish); a server nonce is
// never used twice, so a recorded handshake replayed gets a new Ns and
// fails. The client checks FlagAuth on every connection and the server's
// proof before it sends a request: a server that does not answer the
// offer, or answers with a wrong proof, is refused (no silent downgrade).
// Proofs are HMAC-SHA-256 under the key's secret with a label per use;
// the per-connection proof is cut to the 11 reserved bytes of ConnReq
// (88 bits, against online guessing only: the nonce changes per path).

// Key sizes and wire sizes of authentication.
const (
	// MinKeySecret is the shortest secret a Key may have.
	MinKeySecret = 16
	// MaxKeyName is the longest key name.
	MaxKeyName = 64
	// KeyIDSize is the size of a key id in ConnReq.
	KeyIDSize = 8
	// NonceSize is the size of the server's and the client's nonce.
	NonceSize = 16
	// ConnProofSize is the size of a connection's proof in ConnReq.
	ConnProofSize = connReqAuthLen
	// PathProofSize is the size of a path proof (HMAC-SHA-256).
	PathProofSize = sha256.Size
	// InfoReqAuthSize is the size of the INFO_REQ trailer: le32
	// InfoAuthMagic, client nonce, client proof.
	InfoReqAuthSize = 4 + NonceSize + PathProofSize
	// InfoRspAuthSize is the size of the INFO_RSP trailer: le32
	// InfoAuthMagic, server proof.
	InfoRspAuthSize = 4 + PathProofSize
	// InfoAuthMagic starts both INFO trailers ("UATH" in memory).
	InfoAuthMagic uint32 = 0x48544155
	// FlagAuth (0x20000), in the flags of the connection response: the
	// server authenticates this connection (sent only to a client whose
	// ConnReq said Auth; a kernel client never sees it).
	FlagAuth uint32 = 1 << 17
)

// KeyID names a key on the wire without giving its name away in clear:
// the first 8 bytes of SHA-256 over a label and the name.
type KeyID [KeyIDSize]byte

// Key is a pre-shared authentication key: its name is the identity a
// server sees (policy, audit log, session listing), its secret never
// leaves the host.
type Key struct {
	// Name is 1..MaxKeyName bytes of letters, digits and ._@+-.
	Name string
	// Secret is at least MinKeySecret bytes.
	Secret []byte
}

// Check reports whether k can be used.
func (k *Key) Check() error {
	if len(k.Name) == 0 || len(k.Name) > MaxKeyName {
		return fmt.Errorf("key name %q: length not in 1..%d: %w", k.Name, MaxKeyName, ErrOutOfRange)
	}
	for i := 0; i < len(k.Name); i++ {
		c := k.Name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '@' || c == '+' || c == '-') {
			return fmt.Errorf("key name %q: %q is not a letter, digit or one of ._@+-: %w", k.Name, c, ErrOutOfRange)
		}
	}
	if len(k.Secret) < MinKeySecret {
		return fmt.Errorf("key %q: secret of %d bytes, at least %d needed: %w", k.Name, len(k.Secret), MinKeySecret, ErrOutOfRange)
	}
	return nil
}

// ID returns the key's id.
func (k *Key) ID() KeyID {
	h := sha256.New()
	h.Write([]byte("urnbd rtrs key id\x00"))
	h.Write([]byte(k.Name))
	var id KeyID
	copy(id[:], h.Sum(nil))
	return id
}

// GenerateKey returns a key named name with a 32-byte random secret.
func GenerateKey(name string) (Key, error) {
	k := Key{Name: name, Secret: make([]byte, 32)}
	if _, err := rand.Read(k.Secret); err != nil {
		return Key{}, err
	}
	return k, k.Check()
}

// KeyRing is a server's set of keys, found by id. It is not changed once
// made; a reload makes a new one.
type KeyRing struct {
	byID map[KeyID]*Key
}

// NewKeyRing checks keys and returns a ring of them; two keys with the
// same name (or id) are an error.
func NewKeyRing(keys []Key) (*KeyRing, error) {
	r := &KeyRing{byID: make(map[KeyID]*Key, len(keys))}
	for i := range keys {
		k := keys[i]
		if err := k.Check(); err != nil {
			return nil, err
		}
		id := k.ID()
		if o := r.byID[id]; o != nil {
			return nil, fmt.Errorf("key %q given twice (or shares its id with %q): %w", k.Name, o.Name, ErrOutOfRange)
		}
		r.byID[id] = &k
	}
	return r, nil
}

// Lookup returns the key with id, or nil.
func (r *KeyRing) Lookup(id KeyID) *Key {
	if r == nil {
		return nil
	}
	return r.byID[id]
}

// Len returns the number of keys.
func (r *KeyRing) Len() int {
	if r == nil {
		return 0
	}
	return len(r.byID)
}

// Proof labels: each use of the key has its own, so that no proof can
// stand in for another.
const (
	labelConn   = "urnbd rtrs conn proof v1\x00"
	labelClient = "urnbd rtrs client path proof v1\x00"
	labelServer = "urnbd rtrs server path proof v1\x00"
)

func proofMAC(k *Key, label string) hash.Hash {
	h := hmac.New(sha256.New, k.Secret)
	h.Write([]byte(label))
	return h
}

func writeConnFields(h hash.Hash, req *ConnReq) {
	var b [8]byte
	binary.LittleEndian.PutUint16(b[0:], req.CID)
	binary.LittleEndian.PutUint16(b[2:], req.CIDNum)
	h.Write(req.PathsUUID[:])
	h.Write(req.SessUUID[:])
	h.Write(b[:4])
}

// ConnProof returns the proof that connection req of a path knows k,
// bound to the server nonce of the path.
func ConnProof(k *Key, serverNonce *[NonceSize]byte, req *ConnReq) [ConnProofSize]byte {
	h := proofMAC(k, labelConn)
	h.Write(serverNonce[:])
	writeConnFields(h, req)
	var p [ConnProofSize]byte
	copy(p[:], h.Sum(nil))
	return p
}

// PathAuth is what both ends of a path hash into its proofs.
type PathAuth struct {
	ServerNonce, ClientNonce [NonceSize]byte
	// Req is the path's cid 0 ConnReq (its uuids and cid_num count).
	Req ConnReq
	// Name is the session name of INFO_REQ.
	Name string
}

func (a *PathAuth) proof(k *Key, label string) [PathProofSize]byte {
	h := proofMAC(k, label)
	h.Write(a.ServerNonce[:])
	h.Write(a.ClientNonce[:])
	req := a.Req
	req.CID = 0
	writeConnFields(h, &req)
	h.Write([]byte(a.Name))
	var p [PathProofSize]byte
	copy(p[:], h.Sum(nil))
	return p
}

// ClientProof returns the client's proof for the path.
func (a *PathAuth) ClientProof(k *Key) [PathProofSize]byte { return a.proof(k, labelClient) }

// ServerProof returns the server's proof for the path.
func (a *PathAuth) ServerProof(k *Key) [PathProofSize]byte { return a.proof(k, labelServer) }

// NewNonce returns a random nonce.
func NewNonce() [NonceSize]byte {
	var n [NonceSize]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read does not fail (Go 1.24+)
	return n
}

// proofEqual compares proofs in constant time.
func proofEqual(a, b []byte) bool { return hmac.Equal(a, b) }

// ClientAuth is the client's side of authentication for one connect of a
// path: make a new one per connect. A nil *ClientAuth (no key) does
// nothing and accepts any server.
type ClientAuth struct {
	key      *Key
	pa       PathAuth
	gotNonce bool
}

// NewClientAuth returns the authentication of a connect with key k; nil
// for a nil k.
func NewClientAuth(k *Key) *ClientAuth {
	if k == nil {
		return nil
	}
	return &ClientAuth{key: k}
}

// Errors of a server that fails the client's checks.
var (
	// ErrServerNoAuth: the server does not answer the offer (a kernel
	// server, or a urnbd server without keys).
	ErrServerNoAuth = fmt.Errorf("server does not authenticate: %w", syscall.EPROTONOSUPPORT)
	// ErrServerProof: the server's proof is missing or wrong (it does not
	// hold the key).
	ErrServerProof = fmt.Errorf("server's proof of the key is wrong: %w", syscall.EKEYREJECTED)
)

// AddToConnReq offers authentication in req: the key id on cid 0, the
// connection's proof on the others (after cid 0's CheckConnRsp).
func (a *ClientAuth) AddToConnReq(req *ConnReq) {
	if a == nil {
		return
	}
	req.Auth = true
	if req.CID == 0 {
		req.SetKeyID(a.key.ID())
		return
	}
	req.AuthData = ConnProof(a.key, &a.pa.ServerNonce, req)
}

// CheckConnRsp checks the accepting response rsp to req: the server must
// answer FlagAuth; cid 0's carries the server nonce.
func (a *ClientAuth) CheckConnRsp(req *ConnReq, rsp *ConnRsp) error {
	if a == nil {
		return nil
	}
	if rsp.Flags&FlagAuth == 0 {
		return fmt.Errorf("cid %d: %w", req.CID, ErrServerNoAuth)
	}
	if req.CID == 0 {
		a.pa = PathAuth{ServerNonce: rsp.Nonce, ClientNonce: NewNonce(), Req: *req}
		a.gotNonce = true
	} else if !a.gotNonce {
		return fmt.Errorf("cid %d answered before cid 0: %w", req.CID, syscall.EPROTO)
	}
	return nil
}

// AddToInfoReq adds the client's proof of the path to req, whose name is
// set.
func (a *ClientAuth) AddToInfoReq(req *InfoReq) {
	if a == nil {
		return
	}
	a.pa.Name = req.NameString()
	req.Auth = true
	req.ClientNonce = a.pa.ClientNonce
	req.Proof = a.pa.ClientProof(a.key)
}

// CheckInfoRsp checks the server's proof in rsp.
func (a *ClientAuth) CheckInfoRsp(rsp *InfoRsp) error {
	if a == nil {
		return nil
	}
	want := a.pa.ServerProof(a.key)
	if !rsp.Auth || !proofEqual(want[:], rsp.Proof[:]) {
		return ErrServerProof
	}
	return nil
}

// ExplainRefusal adds what an EACCES refusal of a connection means for
// the authentication of a client with key k (nil: none).
func ExplainRefusal(err error, k *Key) error {
	if !errors.Is(err, syscall.EACCES) {
		return err
	}
	if k == nil {
		return fmt.Errorf("%w (the server requires authentication: give the client a key)", err)
	}
	return fmt.Errorf("%w (the server refused key %q: unknown to it, another secret, or not this session's key)", err, k.Name)
}
