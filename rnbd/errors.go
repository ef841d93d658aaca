package rnbd

import (
	"errors"
	"fmt"

	"github.com/urnbd/urnbd/rtrs"
)

// Sentinel errors of the RNBD codecs. The wire sentinels are the same values
// as package rtrs's, so errors.Is works across both layers; every error
// returned here wraps exactly one of them with the message and field that
// were wrong.
var (
	// ErrTruncated: the input is shorter than the message it must hold.
	ErrTruncated = rtrs.ErrTruncated
	// ErrShortBuffer: the output buffer is too small for the message.
	ErrShortBuffer = rtrs.ErrShortBuffer
	// ErrBadType: the message type is unknown or not the one expected.
	ErrBadType = rtrs.ErrBadType
	// ErrOutOfRange: a field holds a value outside its allowed range.
	ErrOutOfRange = rtrs.ErrOutOfRange

	// ErrPathTooLong: the device path is too long (the kernel server's
	// -EINVAL for paths reaching PATH_MAX).
	ErrPathTooLong = errors.New("device path too long")
	// ErrPathDotDot: the device name contains ".." (the kernel server's
	// -EINVAL).
	ErrPathDotDot = errors.New("device path contains \"..\"")
)

func wireErr(sentinel error, msg, format string, args ...any) error {
	return fmt.Errorf("rnbd %s: %s: %w", msg, fmt.Sprintf(format, args...), sentinel)
}

func errTruncated(msg string, have, want int) error {
	return wireErr(ErrTruncated, msg, "have %d bytes, need %d", have, want)
}

func errShortBuffer(msg string, have, want int) error {
	return wireErr(ErrShortBuffer, msg, "buffer has %d bytes, need %d", have, want)
}
