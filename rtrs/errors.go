package rtrs

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors of the wire codecs. Every error returned by a decoder or
// encoder of this package wraps exactly one of them (test with errors.Is);
// the wrapping error says which message and which field was wrong.
var (
	// ErrTruncated: the input is shorter than the message it must hold.
	ErrTruncated = errors.New("truncated")
	// ErrShortBuffer: the output buffer is too small for the encoded message.
	ErrShortBuffer = errors.New("buffer too small")
	// ErrBadMagic: the magic of a connection request/response is not Magic.
	ErrBadMagic = errors.New("bad magic")
	// ErrBadVersion: the major protocol version is not ProtoVerMajor.
	ErrBadVersion = errors.New("unsupported protocol version")
	// ErrBadType: the message or immediate type is unknown or not the one
	// expected here.
	ErrBadType = errors.New("unexpected message type")
	// ErrOutOfRange: a field holds a value outside its allowed range (buffer
	// id, offset, length, count, errno, name ...).
	ErrOutOfRange = errors.New("field out of range")
	// ErrMsgSize: a request does not fit the chunk or the header budget
	// (the kernel's -EMSGSIZE).
	ErrMsgSize = errors.New("message too large")
)

// wireErr wraps sentinel with the message name and a description of what was
// wrong. It allocates, so it is only called on the error path.
func wireErr(sentinel error, msg, format string, args ...any) error {
	return fmt.Errorf("rtrs %s: %s: %w", msg, fmt.Sprintf(format, args...), sentinel)
}

func errTruncated(msg string, have, want int) error {
	return wireErr(ErrTruncated, msg, "have %d bytes, need %d", have, want)
}

func errShortBuffer(msg string, have, want int) error {
	return wireErr(ErrShortBuffer, msg, "buffer has %d bytes, need %d", have, want)
}

// ErrnoOr returns the errno err wraps, or def: the errno a refusal answers
// a peer with.
func ErrnoOr(err error, def syscall.Errno) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return def
}
