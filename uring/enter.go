package uring

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Submit hands the SQEs obtained since the last submission to the kernel with
// io_uring_enter(2), without waiting for completions. It returns the number
// of SQEs the kernel consumed, which can be less than Pending when the
// kernel stops early (the rest stay pending). With SetupSQPoll it returns
// the number of SQEs newly made visible to the polling thread, and enters
// the kernel only to wake that thread.
//
// Submit makes no system call when there is nothing to submit, retries when
// interrupted by a signal, and does not allocate unless it fails. Errors
// wrap the unix.Errno from the kernel (for example unix.EBUSY or
// unix.EAGAIN when completions must be reaped first).
func (r *Ring) Submit() (submitted int, err error) {
	return r.submit(0, false)
}

// SubmitAndWait is Submit followed by waiting, in the same system call
// (IORING_ENTER_GETEVENTS), until at least waitNr completions are ready to be
// reaped. With waitNr 0 it does not block, but still lets the kernel post
// completions it has deferred (SetupDeferTaskrun, SetupCoopTaskrun, CQ
// overflow).
//
// If a signal interrupts the wait, or the kernel stops submitting early,
// SubmitAndWait enters the kernel again, so on success CQReady() >= waitNr.
func (r *Ring) SubmitAndWait(waitNr uint32) (submitted int, err error) {
	return r.submit(waitNr, true)
}

func (r *Ring) submit(waitNr uint32, wait bool) (int, error) {
	published := r.sqeTail - r.sqTailPub
	toSubmit := r.flushSQ()

	var flags uint32
	if wait || r.cqNeedsFlush() {
		flags |= EnterGetEvents
	}

	if r.flags&SetupSQPoll != 0 {
		// The kernel thread picks up the SQEs by itself unless it sleeps.
		// The tail store in flushSQ precedes this load (sync/atomic
		// operations are sequentially consistent), so either the thread
		// sees the new tail or we see its NEED_WAKEUP flag.
		if atomic.LoadUint32(r.sqFlags)&SQNeedWakeup != 0 {
			flags |= EnterSQWakeup
		}
		if flags == 0 {
			return int(published), nil
		}
		for {
			_, errno := r.enter(toSubmit, waitNr, flags)
			if errno == unix.EINTR {
				continue
			}
			if errno != 0 {
				return int(published), fmt.Errorf("io_uring_enter: %w", errno)
			}
			if wait && r.CQReady() < waitNr {
				flags &^= EnterSQWakeup
				continue
			}
			return int(published), nil
		}
	}

	if toSubmit == 0 && flags == 0 {
		return 0, nil
	}
	submitted := 0
	for {
		n, errno := r.enter(toSubmit, waitNr, flags)
		if errno == unix.EINTR {
			// Nothing was submitted, or the kernel would have reported
			// the count instead; recompute and try again.
			toSubmit = r.sqeTail - atomic.LoadUint32(r.sqHead)
			continue
		}
		if errno != 0 {
			return submitted, fmt.Errorf("io_uring_enter: %w", errno)
		}
		submitted += n
		left := r.sqeTail - atomic.LoadUint32(r.sqHead)
		// The kernel returns early without waiting if it could not
		// submit everything, and swallows a signal that interrupts the
		// wait once it has submitted something. Go on while that makes
		// progress.
		if wait && r.CQReady() < waitNr && (n > 0 || toSubmit == 0) {
			toSubmit = left
			continue
		}
		return submitted, nil
	}
}

// cqNeedsFlush reports whether completions are held back in the kernel until
// it is entered with IORING_ENTER_GETEVENTS.
func (r *Ring) cqNeedsFlush() bool {
	return atomic.LoadUint32(r.sqFlags)&(SQCQOverflow|SQTaskrun) != 0
}

// WaitCQE returns the completion at the head of the queue, entering the
// kernel to wait for one if the queue is empty. Like PeekCQE it does not
// consume the completion. It does not submit pending SQEs (but wakes the
// SQPOLL thread if it sleeps), and does not allocate unless it fails.
func (r *Ring) WaitCQE() (*CQE, error) {
	for {
		if cqe := r.PeekCQE(); cqe != nil {
			return cqe, nil
		}
		_, errno := r.enter(0, 1, EnterGetEvents|r.sqWakeupFlag())
		if errno != 0 && errno != unix.EINTR {
			return nil, fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// WaitCQETimeout is WaitCQE giving up after d: then it returns an error
// wrapping unix.ETIME. It needs FeatExtArg (Linux 5.11). It does not
// allocate unless it fails. A signal restarts the full timeout.
func (r *Ring) WaitCQETimeout(d time.Duration) (*CQE, error) {
	for {
		if cqe := r.PeekCQE(); cqe != nil {
			return cqe, nil
		}
		arg := r.setWaitTimeout(d)
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, 1,
			uintptr(EnterGetEvents|EnterExtArg|r.sqWakeupFlag()),
			uintptr(arg), unsafe.Sizeof(getEventsArg{}))
		runtime.KeepAlive(r)
		if errno == unix.ETIME {
			// The wait timed out, but a completion may have been
			// posted just before.
			if cqe := r.PeekCQE(); cqe != nil {
				return cqe, nil
			}
		}
		if errno != 0 && errno != unix.EINTR {
			return nil, fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// sqWakeupFlag returns EnterSQWakeup if the ring's SQPOLL thread sleeps.
func (r *Ring) sqWakeupFlag() uint32 {
	if r.flags&SetupSQPoll != 0 && atomic.LoadUint32(r.sqFlags)&SQNeedWakeup != 0 {
		return EnterSQWakeup
	}
	return 0
}

// enter is the raw io_uring_enter(2) system call, without a signal mask.
func (r *Ring) enter(toSubmit, minComplete, flags uint32) (int, unix.Errno) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd),
		uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
	return int(n), errno
}
