package rtrs

import (
	"fmt"
	"syscall"
	"time"
)

// MaxReconnectAttemptsLimit is the largest max_reconnect_attempts the
// kernel client accepts (-1 means forever).
const MaxReconnectAttemptsLimit = 9999

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

// ClientTimers are the timing settings of a client session; a zero field
// means the kernel's value.
type ClientTimers struct {
	// ReconnectDelay is waited before each reconnect attempt
	// (ReconnectBackoff).
	ReconnectDelay time.Duration
	// HeartbeatInterval and MissedHeartbeats decide when a silent path is
	// failed (HBInterval, HBMissedMax).
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
	// Timeout bounds the setup of each connection (ConnectTimeout).
	Timeout time.Duration
}

// WithDefaults returns t with the kernel's values in place of zero fields.
func (t ClientTimers) WithDefaults() ClientTimers {
	if t.ReconnectDelay == 0 {
		t.ReconnectDelay = ReconnectBackoff
	}
	if t.HeartbeatInterval == 0 {
		t.HeartbeatInterval = HBInterval
	}
	if t.MissedHeartbeats == 0 {
		t.MissedHeartbeats = HBMissedMax
	}
	if t.Timeout == 0 {
		t.Timeout = ConnectTimeout
	}
	return t
}
