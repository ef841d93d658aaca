package rtrs

import (
	"crypto/tls"
	"fmt"
	"runtime"
	"syscall"
	"time"
)

// MaxReconnectAttemptsLimit is the largest max_reconnect_attempts the
// kernel client accepts (-1 means forever).
const MaxReconnectAttemptsLimit = 9999

// ClientConfig is the configuration of a client session that every
// transport shares; a transport's own config (rdmatr.ClientConfig) adds
// what only it needs. A zero field means the default named at the field.
type ClientConfig struct {
	// SessName is the session name (CheckSessName).
	SessName string
	// Paths are the session's paths, 1..MaxPathsNum.
	Paths []PathAddr
	// Queues is the number of per-CPU queues, and so of IO connections per
	// path (cid 1..Queues; cid 0 is the service connection); default the
	// number of CPUs.
	Queues int
	// AdminQueue adds one more queue (and connection per path) after the
	// per-CPU ones, for control messages such as RNBD's session info, open
	// and close. Its owner runs it on a thread of its own (the client's
	// Admin method). It is never held (HoldIOOnReconnect), and the last
	// permit of the session is kept for it (RequestQueue.SetAdmin).
	AdminQueue bool
	// Policy picks the path of each request.
	Policy MPPolicy
	// MaxReconnectAttempts bounds the failed connect attempts in a row of
	// a path before it gives up and stays disconnected until the user
	// reconnects it: -1 forever (the kernel's default), 0 none.
	MaxReconnectAttempts int
	// ReconnectDelay is waited before each reconnect attempt, plus 0..7 ms
	// of jitter as the kernel; default ReconnectBackoff.
	ReconnectDelay time.Duration
	// HeartbeatInterval and MissedHeartbeats: every interval the client
	// sends a heartbeat on the path's service connection, and a path from
	// which nothing (no message, no completion) has come for more than
	// MissedHeartbeats intervals is failed; defaults HBInterval and
	// HBMissedMax.
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
	// Timeout bounds each connect attempt of a path: address resolution,
	// every connection's setup and the INFO exchange; default
	// ConnectTimeout.
	Timeout time.Duration
	// Logf, if set, receives a line for every path failure and why, for
	// every new reason a connect attempt fails, and when a path gives up.
	Logf func(format string, args ...any)
	// OnLinkEvent, if set, is told when the session loses its last
	// connected path and when a path comes back after that, with the
	// number of such reconnects (Link). It runs on a path goroutine and
	// must not block.
	OnLinkEvent func(ev LinkEvent, gen uint64)
	// HoldIOOnReconnect: after such a reconnect the queues send no request
	// until the client's ResumeIO (the admin queue excepted), so that the
	// user can set up again what a restarted server lost (RNBD reopens
	// its devices).
	HoldIOOnReconnect bool
	// Key, if set, authenticates every path with it (auth.go): a server
	// that does not take the offer, or cannot prove the key, is refused.
	Key *Key
	// TLS, if set, runs every connection over TLS 1.3 (TCP only: package
	// tcp's doc; an RDMA client refuses it, RDMA has no TLS). Without a
	// ServerName the host of each path's address is verified.
	TLS *tls.Config
	// RenewBytes: an IO connection that has carried this many bytes in
	// one direction makes its path reconnect (its requests fail over or
	// wait, as on any path failure), so that TLS keys are renewed long
	// before AES-GCM's bound (about 370 GiB per key). 0: with TLS
	// DefaultRenewBytes, without it never.
	RenewBytes int64
}

// DefaultRenewBytes is RenewBytes with TLS: 64 GiB.
const DefaultRenewBytes = 64 << 30

// RenewAfter returns the bytes after which a connection's path
// reconnects, 0 for never.
func (cfg *ClientConfig) RenewAfter() int64 {
	if cfg.RenewBytes == 0 && cfg.TLS != nil {
		return DefaultRenewBytes
	}
	return cfg.RenewBytes
}

// NumQueues returns the number of queues, the admin queue included.
func (cfg *ClientConfig) NumQueues() int {
	if cfg.AdminQueue {
		return cfg.Queues + 1
	}
	return cfg.Queues
}

// CIDNum returns the number of connections of each path: one per queue
// and the service connection.
func (cfg *ClientConfig) CIDNum() int { return cfg.NumQueues() + 1 }

// Checked returns cfg with the defaults in place of zero fields, or why
// cfg cannot make a session (errors wrap EINVAL or CheckSessName's).
func (cfg ClientConfig) Checked() (ClientConfig, error) {
	if cfg.Queues == 0 {
		cfg.Queues = runtime.NumCPU()
	}
	if cfg.Queues < 1 {
		return cfg, fmt.Errorf("%d queues: %w", cfg.Queues, syscall.EINVAL)
	}
	if err := CheckClientSession(cfg.SessName, len(cfg.Paths), cfg.CIDNum(), cfg.MaxReconnectAttempts); err != nil {
		return cfg, err
	}
	if cfg.ReconnectDelay == 0 {
		cfg.ReconnectDelay = ReconnectBackoff
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = HBInterval
	}
	if cfg.MissedHeartbeats == 0 {
		cfg.MissedHeartbeats = HBMissedMax
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = ConnectTimeout
	}
	if cfg.ReconnectDelay < 0 || cfg.HeartbeatInterval < 0 || cfg.MissedHeartbeats < 0 || cfg.Timeout < 0 {
		return cfg, fmt.Errorf("negative timer in %+v: %w", cfg, syscall.EINVAL)
	}
	return cfg, nil
}

// CheckClientSession checks what a client session needs on any transport:
// a valid session name, 1..MaxPathsNum paths, cidNum connections per path
// (service connection included) within MaxConnsPerPath, and
// maxReconnectAttempts in -1..MaxReconnectAttemptsLimit. Errors wrap
// EINVAL (or CheckSessName's error).
func CheckClientSession(sessName string, paths, cidNum, maxReconnectAttempts int) error {
	if err := CheckSessName(sessName); err != nil {
		return err
	}
	if paths < 1 || paths > MaxPathsNum {
		return fmt.Errorf("%d paths, want 1..%d: %w", paths, MaxPathsNum, syscall.EINVAL)
	}
	if cidNum < 2 || cidNum > MaxConnsPerPath {
		return fmt.Errorf("%d connections per path, want 2..%d: %w", cidNum, MaxConnsPerPath, syscall.EINVAL)
	}
	return CheckMaxReconnectAttempts(maxReconnectAttempts)
}

// CheckMaxReconnectAttempts checks a max_reconnect_attempts value: -1
// (forever) or 0..MaxReconnectAttemptsLimit, as the kernel's sysfs file.
func CheckMaxReconnectAttempts(n int) error {
	if n < -1 || n > MaxReconnectAttemptsLimit {
		return fmt.Errorf("max_reconnect_attempts %d, want -1..%d: %w", n, MaxReconnectAttemptsLimit, syscall.EINVAL)
	}
	return nil
}
