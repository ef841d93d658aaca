package clientd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/urnbd/urnbd/internal/keyfile"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
)

// DefaultTransport is the transport of a new session whose map request
// names none.
const DefaultTransport = "tcp"

// Dial opens the RNBD session that a map request makes: over spec's
// transport (DefaultTransport if none, which it fills in) and paths, with
// queues per-CPU queues (0: one per CPU) and room for devices mapped
// devices (0: rnbd's default). Errors wrap ENXIO for a spec without paths.
func Dial(ctx context.Context, spec *MapSpec, queues, devices int) (*rnbd.Client, error) {
	if len(spec.Paths) == 0 {
		return nil, fmt.Errorf("map: no session %s, and no path= to make it with: %w", spec.SessName, syscall.ENXIO)
	}
	if spec.Transport == "" {
		spec.Transport = DefaultTransport
	}
	cfg := rtrs.ClientConfig{SessName: spec.SessName, Queues: queues, Policy: rtrs.MinInflight, MaxReconnectAttempts: -1}
	if spec.AuthKey != "" {
		k, err := keyfile.ReadOne(spec.AuthKey)
		if err != nil {
			return nil, fmt.Errorf("map: auth_key: %w", err)
		}
		cfg.Key = k
	}
	if spec.TLS {
		tc, err := spec.tlsConfig()
		if err != nil {
			return nil, fmt.Errorf("map: %w", err)
		}
		cfg.TLS = tc
	}
	for _, p := range spec.Paths {
		cfg.Paths = append(cfg.Paths, rtrs.PathAddr{Src: p.Src, Dst: net.JoinHostPort(p.Dst, strconv.Itoa(p.Port))})
	}
	var opts []rnbd.DialOption
	if devices != 0 {
		opts = append(opts, rnbd.WithMaxDevices(devices))
	}
	var c *rnbd.Client
	var err error
	switch spec.Transport {
	case "rdma":
		c, err = rnbd.DialRDMA(ctx, cfg, opts...)
	case "tcp":
		c, err = rnbd.DialTCP(ctx, cfg, opts...)
	default:
		return nil, fmt.Errorf("map: transport %q: want tcp or rdma: %w", spec.Transport, syscall.EINVAL)
	}
	if err != nil {
		return nil, fmt.Errorf("map: session %s to %v: %w", spec.SessName, spec.Paths, err)
	}
	return c, nil
}

// tlsConfig is the client's TLS configuration of spec.
func (spec *MapSpec) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: spec.TLSServerName}
	if spec.TLSCA != "" {
		b, err := os.ReadFile(spec.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("tls_ca %s: no PEM certificate in it: %w", spec.TLSCA, syscall.EINVAL)
		}
	}
	if spec.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(spec.TLSCert, spec.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("tls_cert %s, tls_key %s: %v: %w", spec.TLSCert, spec.TLSKey, err, syscall.EINVAL)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// Fits checks a map request for another device of session s. As the
// kernel does, it ignores the request's paths (the session's may have
// changed since, by path add and remove); a transport, queue count or
// device count that differs from the session's is an error (EINVAL)
// rather than silently not what was asked for. It fills in the session's
// transport.
func (s *Session) Fits(spec *MapSpec, queues, devices int) error {
	if spec.Transport != "" && spec.Transport != s.Spec.Transport {
		return fmt.Errorf("map: session %s runs over %s, not %s; map with another sessname for %s: %w",
			s.Spec.SessName, s.Spec.Transport, spec.Transport, spec.Transport, syscall.EINVAL)
	}
	if spec.TLS && !s.Spec.TLS {
		return fmt.Errorf("map: session %s runs without TLS; map with another sessname for a TLS session: %w", s.Spec.SessName, syscall.EINVAL)
	}
	if spec.AuthKey != "" && spec.AuthKey != s.Spec.AuthKey {
		return fmt.Errorf("map: session %s proves another key than %s; map with another sessname for it: %w",
			s.Spec.SessName, spec.AuthKey, syscall.EINVAL)
	}
	if queues != 0 && queues != s.Queues {
		return fmt.Errorf("map: session %s has %d queues, not %d; map with another sessname for %d: %w",
			s.Spec.SessName, s.Queues, queues, queues, syscall.EINVAL)
	}
	if devices != 0 && devices != s.MaxDevices {
		return fmt.Errorf("map: session %s maps up to %d devices, not %d; map with another sessname for %d: %w",
			s.Spec.SessName, s.MaxDevices, devices, devices, syscall.EINVAL)
	}
	spec.Transport = s.Spec.Transport
	return nil
}
