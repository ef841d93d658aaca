// Package tlstest makes certificate authorities and certificates for
// tests and benchmarks of TLS (ECDSA P-256, valid for an hour, for 127.0.0.1).
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TB is what the helpers need of a testing.TB: a program (a benchmark
// tool) can pass its own.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool
	key  *ecdsa.PrivateKey
}

// NewCA returns a CA named name.
func NewCA(t TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Pool: pool, key: key}
}

// Issue returns a certificate with common name cn for 127.0.0.1, for
// server and client use.
func (ca *CA) Issue(t TB, cn string) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// WriteCA writes the CA's certificate as PEM to dir/name and returns the
// path.
func (ca *CA) WriteCA(t TB, dir, name string) string {
	t.Helper()
	return writePEM(t, filepath.Join(dir, name), "CERTIFICATE", ca.Cert.Raw)
}

// WriteIssued issues a certificate for cn and writes it and its key as
// PEM to dir/cn.crt and dir/cn.key; it returns both paths.
func (ca *CA) WriteIssued(t TB, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	c := ca.Issue(t, cn)
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, filepath.Join(dir, cn+".crt"), "CERTIFICATE", c.Certificate[0]),
		writePEM(t, filepath.Join(dir, cn+".key"), "EC PRIVATE KEY", der)
}

func writePEM(t TB, path, kind string, der []byte) string {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newKey(t TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return n
}
