package uring

import (
	"errors"

	"golang.org/x/sys/unix"
)

// NewLoop creates a ring for the event loop of one thread: a single issuer
// with deferred, cooperative task work, so that completions are reaped
// only when that thread waits. Kernels that refuse these flags get a ring
// without them.
func NewLoop(entries uint32) (*Ring, error) {
	r, err := New(entries, SetupSingleIssuer|SetupDeferTaskrun|SetupCoopTaskrun)
	if err != nil {
		r, err = New(entries, 0)
	}
	return r, err
}

// NextSQE is GetSQE that makes room: when the submission queue is full it
// submits what is pending (one io_uring_enter) and tries again. It fails
// only when the ring refuses to submit (EBUSY and EAGAIN are retried).
func (r *Ring) NextSQE() (*SQE, error) {
	for {
		if s := r.GetSQE(); s != nil {
			return s, nil
		}
		if _, err := r.Submit(); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) {
			return nil, err
		}
	}
}

// Reserve makes room for n entries that must go into the submission
// queue together, such as a chain of linked ones (SQEIOLink): a chain cut
// by a submission in its middle ends there. When fewer than n are free it
// submits what is pending, as NextSQE does. n must not exceed SQEntries.
func (r *Ring) Reserve(n uint32) error {
	for r.SQSpace() < n {
		if _, err := r.Submit(); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) {
			return err
		}
	}
	return nil
}
