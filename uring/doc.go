// Package uring is a thin io_uring interface on golang.org/x/sys/unix: ring
// setup and mapping, submission entries (64 or 128 bytes, for URING_CMD), and
// completion reaping without allocation.
//
// A Ring is not safe for concurrent use: each ring belongs to the one OS thread
// that submits to it (a ublk queue's thread, for instance). The package knows
// nothing of ublk, RTRS or any other user of the ring.
//
// # Use
//
//	r, err := uring.New(64, 0)
//	...
//	sqe := r.GetSQE() // nil when the submission queue is full
//	sqe.PrepRead(fd, unsafe.Pointer(&buf[0]), uint32(len(buf)), off, tag)
//	if _, err := r.SubmitAndWait(1); err != nil { ... }
//	r.ForEachCQE(handle) // handle(cqe *uring.CQE): cqe.UserData == tag, cqe.Res
//
// GetSQE, the Prep methods, Submit, SubmitAndWait, PeekCQE, CQESeen,
// CQAdvance, ForEachCQE, WaitCQE and WaitCQETimeout do not allocate (except
// to build an error), so an event loop built on them runs without garbage.
//
// # Threads
//
// The kernel ties some ring state to the task, that is the OS thread, that
// uses it. With SetupSingleIssuer only the thread that created the ring may
// submit; with SetupDeferTaskrun completions are only posted while that
// thread waits in the kernel; with SetupCoopTaskrun the kernel does not
// interrupt a thread to post completions. A goroutine using such a ring must
// therefore call runtime.LockOSThread before New and stay locked until
// Close, or the Go scheduler will move it to other threads and submissions
// fail with EEXIST or completions are delayed. Plain rings work from any
// goroutine, but a ring still must not be used by two goroutines at once.
//
// # Memory handed to the kernel
//
// Prep methods take buffers as unsafe.Pointer and store them in the SQE as
// plain addresses. The kernel reads and writes that memory after the Prep
// call returns, up to the completion, so it must neither move nor be freed
// before the CQE has been reaped:
//
//   - memory from mmap (unix.Mmap, or a device's mapping) is always fine;
//   - Go heap memory is fine as long as the caller keeps it reachable, for
//     example in the structure that tracks the request;
//   - goroutine stacks move; the Prep methods force the memory behind their
//     pointer arguments onto the heap, so a local array passed to them costs
//     an allocation rather than corrupting memory, but pointers laundered
//     through uintptr or stored directly in SQE fields get no such help.
//
// Closing a ring cancels in-flight requests asynchronously: reap every
// completion before Close, or keep the memory valid regardless.
//
// # Memory ordering
//
// The queue indexes shared with the kernel are accessed with sync/atomic: the
// SQ tail is published with an atomic store after the SQEs are written, the
// SQ head (advanced by the kernel) is read with an atomic load before a slot
// is reused, the CQ tail is read with an atomic load before the CQEs it
// covers, and the CQ head is released with an atomic store after they have
// been read. The SQ index array is filled with the identity mapping once at
// setup, before any tail is published, so slot i always names SQE i; with
// SetupNoSQArray there is no array. When the kernel reports FeatSingleMmap
// the SQ and CQ rings share one mapping.
//
// # Entry sizes
//
// On a ring created with SetupSQE128, GetSQE128 returns an SQE128 whose Cmd
// method gives the 80-byte URING_CMD payload; it panics on a 64-byte ring,
// so the payload can never extend past an entry. Likewise on a SetupCQE32
// ring PeekCQE32 and ForEachCQE32 return CQE32 values with the extra 16
// bytes (Big); PeekCQE and ForEachCQE work on both layouts.
//
// # Not supported
//
// SetupNoMmap and SetupRegisteredFdOnly are refused by NewWithParams.
// SetupIOPoll rings work, but their completions appear only when the kernel
// is entered with SubmitAndWait or WaitCQE; PeekCQE makes no system call.
package uring
