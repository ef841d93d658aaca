package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// startAuthServer starts a memory-backed server whose session layer knows
// keys and requires authentication.
func startAuthServer(t *testing.T, keys ...rtrs.Key) (*Server, string) {
	t.Helper()
	ring, err := rtrs.NewKeyRing(keys)
	if err != nil {
		t.Fatal(err)
	}
	tab := rtrs.NewServerTable(rtrs.ServerTableConfig{Logf: t.Logf, Linger: -1, Auth: rtrs.ServerAuth{Keys: ring, Required: true}})
	srv, err := NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: sessQD, ChunkSize: 64 << 10, MaxHdrSize: 4096,
		HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 5, Sessions: tab}, Handler: newMemBackend(16 << 20)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); tab.Close() })
	return srv, ln.Addr().String()
}

func genKey(t *testing.T, name string) rtrs.Key {
	k, err := rtrs.GenerateKey(name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestAuthKeyedSessionReadsAndWrites(t *testing.T) {
	alice := genKey(t, "alice")
	srv, addr := startAuthServer(t, alice, genKey(t, "bob"))
	cfg := testConfig(rtrs.MinInflight, 2, addr)
	cfg.Key = &alice
	c := dialTestConfig(t, cfg)
	for _, v := range runVerifiers(c, 8, 4096, 20) {
		v.Wait(t, 20*time.Second)
	}
	sess := srv.Sessions().Lookup("test")
	if sess == nil || sess.Identity() != "alice" {
		t.Fatalf("server session %v, want one with identity alice", sess)
	}
}

// dialAuthPath connects one path with cidNum connections and key k.
// Each call is a new session.
func dialAuthPath(addr string, k *rtrs.Key, cidNum int) (*ClientPath, error) {
	return dialPathCfg(PathConfig{Addr: addr, SessName: "p", PathsUUID: rtrs.NewNonce(), SessUUID: rtrs.NewNonce(),
		CIDNum: cidNum, FirstConn: true, Key: k, Timeout: 2 * time.Second})
}

func dialPathCfg(cfg PathConfig) (*ClientPath, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return DialPath(ctx, cfg)
}

func TestAuthRefusedClients(t *testing.T) {
	alice := genKey(t, "alice")
	_, addr := startAuthServer(t, alice)
	mallory := genKey(t, "mallory")
	forged := rtrs.Key{Name: "alice", Secret: []byte("not alice's secret")}
	for _, tc := range []struct {
		name string
		key  *rtrs.Key
		want string
	}{
		{"no key (a kernel client)", nil, "requires authentication"},
		{"unknown key", &mallory, `refused key "mallory"`},
		{"forged secret", &forged, `refused key "alice"`},
	} {
		p, err := dialAuthPath(addr, tc.key, 3)
		if err == nil {
			p.Close()
			t.Errorf("%s: connected", tc.name)
			continue
		}
		var re *RejectError
		if !errors.As(err, &re) || re.Errno != syscall.EACCES || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want a refusal with EACCES saying %q", tc.name, err, tc.want)
		}
	}
	// The right key gets in.
	p, err := dialAuthPath(addr, &alice, 3)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}

// A client with a key refuses a server that does not authenticate.
func TestAuthClientRefusesPlainServer(t *testing.T) {
	_, addr := startIOServer(t, newMemBackend(1<<20), "127.0.0.1:0")
	alice := genKey(t, "alice")
	_, err := dialAuthPath(addr, &alice, 2)
	if !errors.Is(err, rtrs.ErrServerNoAuth) {
		t.Fatalf("keyed client to a plain server: %v, want ErrServerNoAuth", err)
	}
}

// recorder forwards connections to a server and keeps what each client
// sent, in the order the connections came.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	sent [][]byte
}

func startRecorder(t *testing.T, to string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			i := len(r.sent)
			r.sent = append(r.sent, nil)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						r.mu.Lock()
						r.sent[i] = append(r.sent[i], buf[:n]...)
						r.mu.Unlock()
						_, _ = s.Write(buf[:n])
					}
					if err != nil {
						s.Close()
						return
					}
				}
			}()
		}
	}()
	return r
}

// A recorded handshake sent again, byte for byte, is refused: the server's
// nonce is new, so the recorded proofs do not fit.
func TestAuthReplayedHandshakeRefused(t *testing.T) {
	alice := genKey(t, "alice")
	_, addr := startAuthServer(t, alice)
	rec := startRecorder(t, addr)
	p, err := dialAuthPath(rec.ln.Addr().String(), &alice, 2)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	rec.mu.Lock()
	sent := rec.sent
	rec.mu.Unlock()
	if len(sent) != 2 {
		t.Fatalf("recorded %d connections, want 2", len(sent))
	}
	// The server dropped the path when the client closed it; wait for
	// that, or the replay's cid 0 would find the path still there.
	time.Sleep(200 * time.Millisecond)

	replay := func(b []byte) (rtrs.ConnRsp, net.Conn) {
		t.Helper()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := nc.Write(b); err != nil {
			t.Fatal(err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
		f, err := frame.NewDecoder(frame.ToClient).ReadFrame(nc)
		if err != nil {
			t.Fatalf("replay: no answer: %v", err)
		}
		var rsp rtrs.ConnRsp
		if err := rsp.Unmarshal(f.Payload); err != nil {
			t.Fatal(err)
		}
		return rsp, nc
	}
	// cid 0 carries only the key id: accepted, with a new nonce; its
	// recorded INFO_REQ then fails and the server closes the connection.
	rsp0, nc0 := replay(sent[0])
	if rsp0.Errno != 0 || rsp0.Flags&rtrs.FlagAuth == 0 {
		t.Fatalf("replayed cid 0: %+v", rsp0)
	}
	var one [1]byte
	if _, err := nc0.Read(one[:]); err == nil {
		t.Fatal("replayed INFO_REQ answered")
	}
	// cid 1's recorded proof is for the old nonce.
	if rsp1, _ := replay(sent[1]); rsp1.Errno != -int16(syscall.EACCES) {
		t.Fatalf("replayed cid 1: errno %d, want -EACCES", rsp1.Errno)
	}
}
