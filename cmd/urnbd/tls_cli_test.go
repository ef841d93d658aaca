package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/internal/tlstest"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// --tls-cert is read again on SIGHUP: after the files are replaced with a
// certificate of another CA, new handshakes show the new one. Runs on any
// host: the handshake is checked, the kernel's TLS only after it (a host
// without kTLS then says so, which proves the handshake passed). A
// plaintext client is told that TLS is required.
func TestServerTLSReload(t *testing.T) {
	bin := labtest.Binary(t)
	dir := t.TempDir()
	ca1, ca2 := tlstest.NewCA(t, "ca1"), tlstest.NewCA(t, "ca2")
	cert, key := ca1.WriteIssued(t, dir, "server")
	port := strconv.Itoa(freeTCPPort(t))
	srv := osexec.Command(bin, "server", "--listen", "tcp://127.0.0.1:"+port, "--memory", "m0=1M",
		"--admin-socket", filepath.Join(dir, "adm.sock"), "--tls-cert", cert, "--tls-key", key)
	srv.Env = append(os.Environ(), "URNBD_RUN_DIR="+dir)
	log := startLoggedServer(t, srv, dir)
	dial := func(name string, tc *tls.Config) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := rnbd.DialTCP(ctx, rtrs.ClientConfig{SessName: name, Paths: []rtrs.PathAddr{{Dst: "127.0.0.1:" + port}}, TLS: tc})
		if err == nil {
			c.Close()
		}
		return err
	}
	// passed: the handshake went through (then connected, or no kTLS here).
	passed := func(err error) bool { return err == nil || errors.Is(err, tcp.ErrNoKTLS) }
	trust2 := &tls.Config{RootCAs: ca2.Pool}
	if err := dial("before", trust2); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a client trusting ca2 before the reload: %v", err)
	}
	if err := dial("ca1", &tls.Config{RootCAs: ca1.Pool}); !passed(err) {
		t.Fatalf("a client trusting ca1: %v", err)
	}
	if err := dial("plain", nil); !errors.Is(err, tcp.ErrTLSRequired) {
		t.Errorf("a plaintext client: %v, want ErrTLSRequired", err)
	}
	c2, k2 := ca2.WriteIssued(t, t.TempDir(), "server")
	for src, dst := range map[string]string{c2: cert, k2: key} {
		b, _ := os.ReadFile(src)
		os.WriteFile(dst, b, 0o600)
	}
	srv.Process.Signal(syscall.SIGHUP)
	if !labtest.WaitFor(10*time.Second, func() bool { return strings.Contains(log.String(), "TLS certificate "+cert+" read again") }) {
		t.Fatalf("no reload in the log:\n%s", log.String())
	}
	if err := dial("after", trust2); !passed(err) {
		t.Errorf("a client trusting ca2 after the reload: %v", err)
	}
}
