package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log"
	"os"
	"sync/atomic"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

// serverTLS is the server's TLS configuration from --tls-cert, --tls-key
// and --tls-client-ca, read again on SIGHUP: new handshakes use the new
// files, established connections keep theirs.
type serverTLS struct {
	certFile, keyFile, clientCAFile string
	cur                             atomic.Pointer[tls.Config]
}

// newServerTLS reads the TLS flags; nil without --tls-cert.
func newServerTLS(c *cli.Context) (*serverTLS, error) {
	s := &serverTLS{certFile: c.String("tls-cert"), keyFile: c.String("tls-key"), clientCAFile: c.String("tls-client-ca")}
	switch {
	case s.certFile == "" && s.keyFile == "" && s.clientCAFile == "":
		return nil, nil
	case s.certFile == "" || s.keyFile == "":
		return nil, badUsage(c, "TLS needs both --tls-cert and --tls-key")
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *serverTLS) load() error {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return fmt.Errorf("tls: certificate %s, key %s: %v: %w", s.certFile, s.keyFile, err, unix.EINVAL)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	if s.clientCAFile != "" {
		pool, err := readCAs(s.clientCAFile)
		if err != nil {
			return err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	s.cur.Store(cfg)
	return nil
}

// config is the configuration the server runs with: each handshake takes
// the newest one loaded.
func (s *serverTLS) config() *tls.Config {
	if s == nil {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return s.cur.Load(), nil
	}}
}

// reload reads the files again on SIGHUP; a failure keeps the old ones.
func (s *serverTLS) reload() {
	if s == nil {
		return
	}
	if err := s.load(); err != nil {
		log.Printf("urnbd server: SIGHUP: %v; the certificates in force stay", err)
		return
	}
	log.Printf("urnbd server: SIGHUP: TLS certificate %s read again", s.certFile)
}

// readCAs reads a PEM bundle of CA certificates.
func readCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: CA bundle %s: no PEM certificate in it: %w", file, unix.EINVAL)
	}
	return pool, nil
}
