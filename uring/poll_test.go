package uring

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func eventfd(t *testing.T) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func signal(t *testing.T, fd int) {
	t.Helper()
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	if _, err := unix.Write(fd, b[:]); err != nil {
		t.Fatal(err)
	}
}

func drain(t *testing.T, fd int) {
	t.Helper()
	var b [8]byte
	if _, err := unix.Read(fd, b[:]); err != nil {
		t.Fatal(err)
	}
}

func TestMultishotPoll(t *testing.T) {
	r := newRing(t, 8, 0)
	efd := eventfd(t)
	const pollUD = 42

	r.GetSQE().PrepPollAdd(int32(efd), unix.POLLIN, true, pollUD)
	submitAll(t, r)
	if r.PeekCQE() != nil {
		t.Fatalf("poll completed before the eventfd was signalled")
	}

	for i := range 4 {
		signal(t, efd)
		c := reap(t, r, 1)[0]
		if c.UserData != pollUD || c.Res&unix.POLLIN == 0 || c.Flags&CQEFMore == 0 {
			t.Fatalf("wake-up %d: CQE %+v, want POLLIN with CQEFMore", i, c)
		}
		drain(t, efd)
		// Some kernels post a second CQE for the same wake-up; allow it.
		for c := r.PeekCQE(); c != nil; c = r.PeekCQE() {
			if c.UserData != pollUD || c.Flags&CQEFMore == 0 {
				t.Fatalf("wake-up %d: extra CQE %+v", i, *c)
			}
			r.CQESeen()
		}
	}

	r.GetSQE().PrepPollRemove(pollUD, 43)
	submitAll(t, r)
	var sawFinal, sawRemove bool
	for !sawFinal || !sawRemove {
		c := reap(t, r, 1)[0]
		switch {
		case c.UserData == 43:
			expectRes(t, "poll remove", c, 0)
			sawRemove = true
		case c.UserData == pollUD && c.Flags&CQEFMore == 0:
			if c.Err() != unix.ECANCELED {
				t.Errorf("final poll CQE res %d (%s), want -ECANCELED", c.Res, errnoName(c.Res))
			}
			sawFinal = true
		case c.UserData == pollUD:
			// a late wake-up, still with CQEFMore
		default:
			t.Fatalf("unexpected CQE %+v", c)
		}
	}
}

func TestAsyncCancel(t *testing.T) {
	r := newRing(t, 8, 0)
	efd := eventfd(t)
	r.GetSQE().PrepPollAdd(int32(efd), unix.POLLIN, false, 1)
	submitAll(t, r)
	r.GetSQE().PrepAsyncCancel(1, 2)
	submitAll(t, r)
	res := map[uint64]int32{}
	for _, c := range reap(t, r, 2) {
		res[c.UserData] = c.Res
	}
	if res[1] != -int32(unix.ECANCELED) || res[2] != 0 {
		t.Errorf("results %v, want poll -ECANCELED and cancel 0", res)
	}
	c := run(t, r, func(s *SQE) { s.PrepAsyncCancel(12345, 3) })
	if c.Err() != unix.ENOENT {
		t.Errorf("cancel of nothing: res %d, want -ENOENT", c.Res)
	}
}

func TestTimeout(t *testing.T) {
	r := newRing(t, 8, 0)
	ts := NsecToTimespec(int64(10 * time.Millisecond))
	start := time.Now()
	c := run(t, r, func(s *SQE) { s.PrepTimeout(&ts, 0, 0, 7) })
	if c.UserData != 7 || c.Err() != unix.ETIME {
		t.Errorf("timeout CQE %+v, want -ETIME", c)
	}
	if d := time.Since(start); d < 9*time.Millisecond {
		t.Errorf("timeout fired after %v", d)
	}

	// A count of 1 completes the timeout with the next completion.
	long := NsecToTimespec(int64(time.Minute))
	r.GetSQE().PrepTimeout(&long, 1, 0, 8)
	r.GetSQE().PrepNop(9)
	submitAll(t, r)
	res := map[uint64]int32{}
	for _, c := range reap(t, r, 2) {
		res[c.UserData] = c.Res
	}
	if res[8] != 0 || res[9] != 0 {
		t.Errorf("results %v, want timeout 0 (count reached) and NOP 0", res)
	}
}

// Signals delivered to the thread blocked in io_uring_enter interrupt the
// wait; SubmitAndWait and WaitCQE must keep waiting regardless.
func TestWaitInterrupted(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRing(t, 8, 0)
	efd := eventfd(t)
	pid, tid := unix.Getpid(), unix.Gettid()

	interrupt := func(d time.Duration) chan int {
		sent := make(chan int, 1)
		go func() {
			n := 0
			for end := time.Now().Add(d); time.Now().Before(end); n++ {
				// SIGURG is the Go runtime's preemption signal, so the
				// runtime ignores the extra ones.
				if err := unix.Tgkill(pid, tid, unix.SIGURG); err != nil {
					t.Error(err)
				}
				time.Sleep(time.Millisecond)
			}
			signal(t, efd)
			sent <- n
		}()
		return sent
	}

	sent := interrupt(50 * time.Millisecond)
	r.GetSQE().PrepPollAdd(int32(efd), unix.POLLIN, false, 1)
	n, err := r.SubmitAndWait(1)
	if err != nil || n != 1 {
		t.Fatalf("SubmitAndWait(1) = %d, %v", n, err)
	}
	if r.CQReady() < 1 {
		t.Fatalf("SubmitAndWait returned without a completion")
	}
	t.Logf("SubmitAndWait survived %d signals", <-sent)
	c := reap(t, r, 1)[0]
	if c.UserData != 1 || c.Res&unix.POLLIN == 0 {
		t.Fatalf("CQE %+v", c)
	}
	drain(t, efd)

	r.GetSQE().PrepPollAdd(int32(efd), unix.POLLIN, false, 2)
	submitAll(t, r)
	sent = interrupt(50 * time.Millisecond)
	cqe, err := r.WaitCQE()
	if err != nil || cqe.UserData != 2 {
		t.Fatalf("WaitCQE = %+v, %v", cqe, err)
	}
	r.CQESeen()
	t.Logf("WaitCQE survived %d signals", <-sent)
}
