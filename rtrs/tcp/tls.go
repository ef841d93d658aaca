package tcp

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TLS on the TCP transport. crypto/tls runs a TLS 1.3 handshake on every
// connection, before its ConnReq: the server's certificate, optionally the
// client's (mutual TLS). The connection's records are then the kernel's
// (kTLS, TCP_ULP "tls"), keyed with material exported from the handshake
// (RFC 8446 §7.5, label tlsExportLabel): the data path (the client's
// io_uring reads and writevs, the server's reads and writevs) stays as it
// is, with the kernel encrypting and decrypting in place, and allocates
// nothing per request. Session tickets are off, so neither side has
// application data in crypto/tls's buffers when the kernel takes over;
// the server speaks first (one byte, tlsReady, over kTLS), so the client
// cannot send before the server's kernel has its keys.
//
// A server with TLS refuses a plaintext ConnReq with EPROTONOSUPPORT; a
// server without TLS closes a connection that starts with a TLS
// handshake record and logs why.

// Constants of linux/tls.h.
const (
	solTLS                = unix.SOL_TLS
	tlsTX                 = 1
	tlsRX                 = 2
	tls13Version          = 0x0304
	tlsCipherAESGCM128    = 51
	tlsCipherAESGCM256    = 52
	tlsCipherChaCha20Poly = 54
)

// tlsExportLabel names our use of the TLS exporter.
const tlsExportLabel = "EXPORTER-urnbd-rtrs-ktls-v1"

// tlsReady is the byte the server sends over kTLS once its keys are in.
const tlsReady = 0x5A

// tlsRecordHandshake is the first byte of a TLS ClientHello record.
const tlsRecordHandshake = 0x16

// ErrTLSRequired is the refusal of a plaintext client by a server that
// requires TLS.
var ErrTLSRequired = fmt.Errorf("the server requires TLS: %w", syscall.EPROTONOSUPPORT)

// ErrNoKTLS says the kernel has no TLS (modprobe tls).
var ErrNoKTLS = errors.New("the kernel's TLS (kTLS) is not available: modprobe tls")

// ErrCertRefused says the server closed the connection after the TLS
// handshake, as a server does that refuses the client's certificate.
var ErrCertRefused = errors.New("it refused our certificate")

// errClosedAfterHandshake says the peer closed the socket between the
// handshake and the kernel taking over its records.
var errClosedAfterHandshake = errors.New("connection closed after the handshake")

// ktlsCipher is a TLS 1.3 suite as kTLS knows it.
type ktlsCipher struct {
	kind           uint16
	keyLen, ivLen  int // ivLen: the part of the 12-byte nonce base kTLS calls iv
	saltLen, total int // total: size of the crypto_info struct
}

func cipherOf(suite uint16) (ktlsCipher, error) {
	switch suite {
	case tls.TLS_AES_128_GCM_SHA256:
		return ktlsCipher{kind: tlsCipherAESGCM128, keyLen: 16, ivLen: 8, saltLen: 4, total: 4 + 8 + 16 + 4 + 8}, nil
	case tls.TLS_AES_256_GCM_SHA384:
		return ktlsCipher{kind: tlsCipherAESGCM256, keyLen: 32, ivLen: 8, saltLen: 4, total: 4 + 8 + 32 + 4 + 8}, nil
	case tls.TLS_CHACHA20_POLY1305_SHA256:
		return ktlsCipher{kind: tlsCipherChaCha20Poly, keyLen: 32, ivLen: 12, saltLen: 0, total: 4 + 12 + 32 + 8}, nil
	}
	return ktlsCipher{}, fmt.Errorf("TLS suite %s: kTLS has no such cipher: %w", tls.CipherSuiteName(suite), syscall.EPROTONOSUPPORT)
}

// cryptoInfo lays out struct tls12_crypto_info_* for one direction: key
// and 12-byte nonce base (salt and iv, or iv alone for ChaCha20), record
// sequence 0.
func (c ktlsCipher) cryptoInfo(key, nonce []byte) []byte {
	b := make([]byte, c.total)
	binary.LittleEndian.PutUint16(b[0:], tls13Version)
	binary.LittleEndian.PutUint16(b[2:], c.kind)
	// Layout: info, iv, key, salt, rec_seq. The nonce base is salt ‖ iv.
	off := 4
	copy(b[off:off+c.ivLen], nonce[c.saltLen:])
	off += c.ivLen
	copy(b[off:off+c.keyLen], key)
	off += c.keyLen
	copy(b[off:off+c.saltLen], nonce[:c.saltLen])
	return b
}

// installKTLS hands the connection's records to the kernel: tx and rx are
// the directions' (key, nonce base) from the exporter.
func installKTLS(nc *net.TCPConn, cs *tls.ConnectionState, client bool) error {
	c, err := cipherOf(cs.CipherSuite)
	if err != nil {
		return err
	}
	m, err := cs.ExportKeyingMaterial(tlsExportLabel, nil, 2*(c.keyLen+12))
	if err != nil {
		return fmt.Errorf("tls exporter: %w", err)
	}
	cKey, cNonce := m[:c.keyLen], m[c.keyLen:c.keyLen+12]
	sKey, sNonce := m[c.keyLen+12:2*c.keyLen+12], m[2*c.keyLen+12:]
	tx, rx := c.cryptoInfo(cKey, cNonce), c.cryptoInfo(sKey, sNonce)
	if !client {
		tx, rx = rx, tx
	}
	raw, err := nc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if e := unix.SetsockoptString(int(fd), unix.SOL_TCP, unix.TCP_ULP, "tls"); e != nil {
			if e == unix.ENOTCONN {
				// The kernel takes the ULP only on an established
				// socket: the peer has already closed it.
				serr = errClosedAfterHandshake
				return
			}
			serr = fmt.Errorf("%w (setsockopt TCP_ULP: %v)", ErrNoKTLS, e)
			return
		}
		if e := unix.SetsockoptString(int(fd), solTLS, tlsTX, string(tx)); e != nil {
			serr = fmt.Errorf("setsockopt TLS_TX: %w", e)
			return
		}
		if e := unix.SetsockoptString(int(fd), solTLS, tlsRX, string(rx)); e != nil {
			serr = fmt.Errorf("setsockopt TLS_RX: %w", e)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// tlsConfig is cfg for one of our connections: TLS 1.3 only, no session
// tickets (no data may wait in crypto/tls when the kernel takes over).
// A configuration from GetConfigForClient gets the same.
func tlsConfig(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.MinVersion = tls.VersionTLS13
	c.SessionTicketsDisabled = true
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			n, err := get(h)
			if n != nil {
				n = n.Clone()
				n.MinVersion, n.SessionTicketsDisabled, n.GetConfigForClient = tls.VersionTLS13, true, nil
			}
			return n, err
		}
	}
	return c
}

// clientTLS runs the client's handshake on nc and moves it to kTLS.
func clientTLS(ctx context.Context, nc *net.TCPConn, cfg *tls.Config, timeout time.Duration) (tls.ConnectionState, error) {
	_ = nc.SetDeadline(time.Now().Add(timeout))
	defer nc.SetDeadline(time.Time{})
	tc := tls.Client(nc, tlsConfig(cfg))
	if err := tc.HandshakeContext(ctx); err != nil {
		return tls.ConnectionState{}, fmt.Errorf("TLS handshake with %v: %w (does the server run with TLS?)", nc.RemoteAddr(), err)
	}
	cs := tc.ConnectionState()
	err := installKTLS(nc, &cs, true)
	if err == nil {
		var b [1]byte
		if _, rerr := nc.Read(b[:]); errors.Is(rerr, os.ErrDeadlineExceeded) {
			// Slow, not a refusal (that is a close): the caller may retry.
			return cs, fmt.Errorf("TLS with %v: no ready byte from the server within %v of the connect: %w", nc.RemoteAddr(), timeout, syscall.ETIMEDOUT)
		} else if rerr != nil {
			err = rerr
		} else if b[0] != tlsReady {
			err = fmt.Errorf("ready byte %#x", b[0])
		} else {
			return cs, nil
		}
	} else if err != errClosedAfterHandshake {
		return cs, err
	}
	// The server checks our certificate after its side of the handshake
	// is done: a refusal shows as a close, before or after the kernel
	// took the socket.
	return cs, fmt.Errorf("TLS with %v: the server closed the connection after the handshake (%v): %w (none, or not from its --tls-client-ca; see its log): %w", nc.RemoteAddr(), err, ErrCertRefused, syscall.EACCES)
}

// prefixConn is a net.Conn that returns one byte read before first.
type prefixConn struct {
	net.Conn
	b   [1]byte
	has bool
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if c.has && len(p) > 0 {
		p[0], c.has = c.b[0], false
		return 1, nil
	}
	return c.Conn.Read(p)
}

// serverTLS runs the server's handshake on nc (whose first byte, already
// read, is first) and moves it to kTLS.
func serverTLS(nc *net.TCPConn, first byte, cfg *tls.Config, timeout time.Duration) (tls.ConnectionState, error) {
	_ = nc.SetDeadline(time.Now().Add(timeout))
	defer nc.SetDeadline(time.Time{})
	tc := tls.Server(&prefixConn{Conn: nc, b: [1]byte{first}, has: true}, tlsConfig(cfg))
	if err := tc.Handshake(); err != nil {
		return tls.ConnectionState{}, fmt.Errorf("TLS handshake: %w", err)
	}
	cs := tc.ConnectionState()
	if err := installKTLS(nc, &cs, false); err != nil {
		return cs, err
	}
	if _, err := nc.Write([]byte{tlsReady}); err != nil {
		return cs, fmt.Errorf("TLS ready byte: %w", err)
	}
	return cs, nil
}

// CertName returns the name a client certificate identifies: its subject
// common name, else its first DNS name, URI or e-mail address; "" without
// a certificate.
func CertName(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return ""
	}
	c := cs.PeerCertificates[0]
	switch {
	case c.Subject.CommonName != "":
		return c.Subject.CommonName
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.EmailAddresses) > 0:
		return c.EmailAddresses[0]
	}
	return ""
}
