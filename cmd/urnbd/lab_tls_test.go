package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/internal/tlstest"
)

// The user's path with TLS (kTLS) and client certificates: urnbd server
// --tls-cert/--tls-key/--tls-client-ca with a rule for one certificate
// name; the client with that certificate maps and fio verifies through
// ublk; one with another certificate of the same CA is refused (EACCES,
// audit line naming it); a plaintext client is told that TLS is required.
func TestLabCLIMapOverTLS(t *testing.T) {
	c := newLabCLI(t)
	dir := t.TempDir()
	f, _ := os.Create(filepath.Join(dir, "a.img"))
	f.Truncate(256 << 20)
	f.Close()
	ca, clients := tlstest.NewCA(t, "server ca"), tlstest.NewCA(t, "client ca")
	caFile, clientCAFile := ca.WriteCA(t, dir, "ca.pem"), clients.WriteCA(t, dir, "client-ca.pem")
	srvCert, srvKey := ca.WriteIssued(t, dir, "server")
	webCert, webKey := clients.WriteIssued(t, dir, "web1")
	badCert, badKey := clients.WriteIssued(t, dir, "intruder")
	conf := filepath.Join(dir, "server.toml")
	os.WriteFile(conf, []byte("[[allow]]\ncerts = [\"web*\"]\nexports = [\"a.img\"]\naccess = \"rw\"\n"), 0o600)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd := c.cmd("server", "--listen", "tcp://127.0.0.1:"+port, "--dev-search-path", dir, "--config", conf,
		"--tls-cert", srvCert, "--tls-key", srvKey, "--tls-client-ca", clientCAFile)
	log := startLoggedServer(t, cmd, dir)

	mapArgs := func(sess string, extra ...string) []string {
		return append([]string{"map", "sessname=" + sess, "dest_port=" + port, "path=ip:127.0.0.1", "device_path=a.img"}, extra...)
	}
	dev := c.must(mapArgs("web1", "tls_ca="+caFile, "tls_cert="+webCert, "tls_key="+webKey)...)
	t.Cleanup(func() { c.run("unmap", "--force", dev) })
	res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "32M")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify over TLS: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	c.must("unmap", dev)

	out, err := c.run(mapArgs("intruder", "tls_ca="+caFile, "tls_cert="+badCert, "tls_key="+badKey)...)
	if exitCodeOf(err) != int(syscall.EACCES) {
		t.Errorf("a certificate the rules do not name: %v %s; want EACCES", err, out)
	}
	if !strings.Contains(log.String(), `audit: open refused: session "intruder" from [127.0.0.1], key none, certificate "intruder", export "a.img"`) {
		t.Errorf("no audit line naming the certificate:\n%s", log.String())
	}
	out, err = c.run(mapArgs("plain")...)
	if err == nil || !strings.Contains(out, "requires TLS") {
		t.Errorf("a plaintext client: %v %s; want it told that TLS is required", err, out)
	}
	out, err = c.run(mapArgs("nocert", "tls_ca="+caFile)...)
	if err == nil || !strings.Contains(out, "refused our certificate") {
		t.Errorf("a TLS client without a certificate: %v %s", err, out)
	}
}
