package tcp

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/internal/tlstest"
	"github.com/urnbd/urnbd/rtrs"
)

// haveKTLS reports whether this kernel has kTLS: TCP_ULP "tls" on a
// connected loopback socket.
func haveKTLS(t testing.TB) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			time.Sleep(100 * time.Millisecond)
			c.Close()
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	raw, _ := nc.(*net.TCPConn).SyscallConn()
	var serr error
	raw.Control(func(fd uintptr) { serr = unix.SetsockoptString(int(fd), unix.SOL_TCP, unix.TCP_ULP, "tls") })
	return serr == nil
}

// needKTLS skips t without kTLS (fails it in the lab, whose kernel has it).
func needKTLS(t *testing.T) {
	if haveKTLS(t) {
		return
	}
	if labtest.InLab() {
		t.Fatal("in the lab but the kernel has no kTLS (tls module)")
	}
	t.Skip("needs the kernel's TLS (kTLS, the tls module), which this host's kernel lacks; it runs in the lab (tools/test.sh lab)")
}

// tlsConnectTimeout bounds a TLS test's connect attempts: a handshake in
// a freshly booted lab VM under a busy host took more than the 2 s of
// testConfig.
const tlsConnectTimeout = 10 * time.Second

// startTLSServer starts a memory server with TLS (the server's certificate
// from ca; client certificates from clientCA required if not nil).
func startTLSServer(t *testing.T, ca, clientCA *tlstest.CA) (*Server, string) {
	t.Helper()
	return startTLSServerWith(t, newMemBackend(16<<20), ca, clientCA)
}

// startTLSServerWith is startTLSServer with handler h.
func startTLSServerWith(t *testing.T, h ServerHandler, ca, clientCA *tlstest.CA) (*Server, string) {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "server")}}
	if clientCA != nil {
		cfg.ClientCAs, cfg.ClientAuth = clientCA.Pool, tls.RequireAndVerifyClientCert
	}
	srv, err := NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: sessQD, ChunkSize: 64 << 10, MaxHdrSize: 4096,
		HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 5, Logf: t.Logf}, Handler: h, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv, ln.Addr().String()
}

func dialTLSPath(addr string, cfg *tls.Config) (*ClientPath, error) {
	p, err := dialPathCfg(PathConfig{Addr: addr, SessName: "p", PathsUUID: rtrs.NewNonce(), SessUUID: rtrs.NewNonce(),
		CIDNum: 2, FirstConn: true, TLS: cfg, Timeout: 2 * time.Second})
	return p, err
}

// The refusals that happen before the kernel takes the records over,
// on any host: a plaintext client of a TLS server, a TLS client of a
// plaintext server, a server certificate from another CA, and (on a
// host without kTLS) the clear error that kTLS is missing.
func TestTLSRefusals(t *testing.T) {
	ca, other := tlstest.NewCA(t, "ca"), tlstest.NewCA(t, "other ca")
	_, addr := startTLSServer(t, ca, nil)

	_, err := dialTLSPath(addr, nil)
	var re *RejectError
	if !errors.As(err, &re) || re.Errno != syscall.EPROTONOSUPPORT || !errors.Is(err, ErrTLSRequired) {
		t.Errorf("plaintext client of a TLS server: %v; want a refusal saying TLS is required", err)
	}
	_, err = dialTLSPath(addr, &tls.Config{RootCAs: other.Pool})
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("server certificate from another CA: %v", err)
	}
	_, plain := startIOServer(t, newMemBackend(1<<20), "127.0.0.1:0")
	if _, err = dialTLSPath(plain, &tls.Config{RootCAs: ca.Pool}); err == nil || !strings.Contains(err.Error(), "does the server run with TLS") {
		t.Errorf("TLS client of a plaintext server: %v", err)
	}
	if !haveKTLS(t) {
		_, err = dialTLSPath(addr, &tls.Config{RootCAs: ca.Pool})
		if !errors.Is(err, ErrNoKTLS) {
			t.Errorf("TLS on a kernel without kTLS: %v, want ErrNoKTLS", err)
		}
	}
}

// Over TLS with client certificates (kTLS): verified reads and writes,
// the session named by the client's certificate; a client without a
// certificate, or with one from another CA, does not get a path.
func TestLabTLSSessionReadsAndWrites(t *testing.T) {
	needKTLS(t)
	ca, clients, other := tlstest.NewCA(t, "ca"), tlstest.NewCA(t, "client ca"), tlstest.NewCA(t, "other ca")
	srv, addr := startTLSServer(t, ca, clients)
	cfg := testConfig(rtrs.MinInflight, 2, addr)
	cfg.Timeout = tlsConnectTimeout
	cfg.TLS = &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{clients.Issue(t, "web1")}}
	cfg.RenewBytes = 2 << 20 // new keys (a new TLS connection) every 2 MiB
	c := dialTestConfig(t, cfg)
	for _, size := range []int{4096, 60 << 10} {
		for _, v := range runVerifiers(c, 8, size, 20) {
			v.Wait(t, 30*time.Second)
		}
	}
	if n := c.Paths()[0].Stats.Snapshot().ReconnectsOK; n < 3 {
		t.Errorf("%d connects over the run, want new ones for new keys every 2 MiB", n)
	}
	if s := srv.Sessions().Lookup("test"); s == nil || s.CertName() != "web1" {
		t.Fatalf("session %v, want one named by certificate web1", s)
	}
	for name, tc := range map[string]*tls.Config{
		"no client certificate":       {RootCAs: ca.Pool},
		"certificate from another CA": {RootCAs: ca.Pool, Certificates: []tls.Certificate{other.Issue(t, "web1")}},
	} {
		if p, err := dialTLSPath(addr, tc); err == nil {
			p.Close()
			t.Errorf("%s: connected", name)
		} else if !errors.Is(err, ErrCertRefused) || !errors.Is(err, syscall.EACCES) || strings.Contains(err.Error(), "key") {
			t.Errorf("%s: %v; want the certificate refusal (EACCES), and no word of keys", name, err)
		}
	}
}

// With TLS on, the datapath of client and server still allocates nothing
// per request: the kernel encrypts and decrypts in place.
func TestLabTLSAllocatesNothingPerRequest(t *testing.T) {
	needKTLS(t)
	ca := tlstest.NewCA(t, "ca")
	_, addr := startTLSServer(t, ca, nil)
	cfg := testConfig(rtrs.MinInflight, 1, addr)
	cfg.Timeout = tlsConnectTimeout
	cfg.TLS = &tls.Config{RootCAs: ca.Pool}
	checkNoAllocsPerRequest(t, dialTestConfig(t, cfg))
}

// Over kTLS, large reads spliced into the socket arrive intact (the
// kernel encrypts the pipe's pages).
func TestLabTLSSpliceRead(t *testing.T) {
	needKTLS(t)
	ca := tlstest.NewCA(t, "ca")
	b := newFileBackend(t, 16<<20)
	_, addr := startTLSServerWith(t, b, ca, nil)
	cfg := testConfig(rtrs.MinInflight, 2, addr)
	cfg.Timeout = tlsConnectTimeout
	cfg.TLS = &tls.Config{RootCAs: ca.Pool}
	c := dialTestConfig(t, cfg)
	for _, v := range runVerifiers(c, 8, 60<<10, 10) {
		v.Wait(t, 30*time.Second)
	}
	if b.spliced.Load() == 0 {
		t.Error("no read was spliced")
	}
}

// A server that finishes the handshake but never says it is ready is
// slow, not a refusal: the connect fails with ETIMEDOUT, not EACCES.
func TestLabTLSReadyTimeout(t *testing.T) {
	needKTLS(t)
	ca := tlstest.NewCA(t, "ca")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNoErr(t, err)
	t.Cleanup(func() { ln.Close() })
	cfg := &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "server")}}
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if tls.Server(nc, cfg).Handshake() == nil {
			time.Sleep(5 * time.Second) // longer than the client's timeout
		}
	}()
	_, err = dialTLSPath(ln.Addr().String(), &tls.Config{RootCAs: ca.Pool})
	if !errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, ErrCertRefused) {
		t.Errorf("silent server after the handshake: %v; want ETIMEDOUT, not a certificate refusal", err)
	}
}
