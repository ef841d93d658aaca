package rdma

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors of this package wrap the errno that rdma-core reported, with the
// name of the failing call and its main argument as context, so callers
// can test them with errors.Is(err, unix.ECONNREFUSED) and the like.

// ErrClosed is returned when an object is used after Destroy/Close.
var ErrClosed = errors.New("rdma: use of destroyed object")

// errnoOf returns the errno in err (from a cgo call, which gives a bare
// syscall.Errno), or EIO when the library failed without setting errno.
// It does not allocate.
func errnoOf(err error) error {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return e
	}
	return syscall.EIO
}

// retErrno turns the return value of a verbs call that returns an errno
// (ibv_post_send, ibv_req_notify_cq, ...) into an error. Some providers
// return -1 and set errno instead; cerr is errno from the cgo call.
func retErrno(ret int, cerr error) error {
	switch {
	case ret == 0:
		return nil
	case ret > 0:
		return syscall.Errno(ret)
	case ret < -1:
		return syscall.Errno(-ret)
	default:
		return errnoOf(cerr)
	}
}

// PostError is returned by SendBatch.Post and RecvBatch.Post when the
// provider refused a work request: requests before Index were posted,
// the one at Index and those after it were not.
type PostError struct {
	Op    string // "ibv_post_send" or "ibv_post_recv"
	Index int    // first request not posted
	Err   error  // the errno
}

func (e *PostError) Error() string {
	return fmt.Sprintf("%s: work request %d: %v", e.Op, e.Index, e.Err)
}

func (e *PostError) Unwrap() error { return e.Err }
