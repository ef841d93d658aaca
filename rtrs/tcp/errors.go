package tcp

import (
	"fmt"
	"syscall"
)

// RejectError is returned by the client when the server refused a
// connection with a ConnRsp carrying a non-zero errno. It unwraps to the
// syscall.Errno, so errors.Is(err, syscall.ENXIO) works.
type RejectError struct {
	// CID is the connection that was refused.
	CID uint16
	// Errno is the positive errno of the refusal.
	Errno syscall.Errno
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("rtrs/tcp: server rejected connection cid %d: %v (-%d)", e.CID, e.Errno, int(e.Errno))
}

// Unwrap returns e.Errno.
func (e *RejectError) Unwrap() error { return e.Errno }
