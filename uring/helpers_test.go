package uring

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newRing creates a ring for a test and closes it at the end. It skips the
// test if the kernel has no io_uring or does not let this process use it.
func newRing(t testing.TB, entries, flags uint32) *Ring {
	t.Helper()
	p := Params{Flags: flags}
	return newRingParams(t, entries, &p)
}

func newRingParams(t testing.TB, entries uint32, p *Params) *Ring {
	t.Helper()
	r, err := NewWithParams(entries, p)
	skipIfNoURing(t, err)
	if err != nil {
		t.Fatalf("NewWithParams(%d, flags %#x): %v", entries, p.Flags, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func skipIfNoURing(t testing.TB, err error) {
	t.Helper()
	switch {
	case errors.Is(err, unix.ENOSYS):
		t.Skip("io_uring_setup: ENOSYS: kernel built without io_uring")
	case errors.Is(err, unix.EPERM):
		t.Skip("io_uring_setup: EPERM: io_uring disabled (kernel.io_uring_disabled sysctl or seccomp)")
	}
}

// waitTimeout bounds every wait in the tests, so that a request that never
// completes fails the test instead of hanging it.
const waitTimeout = 5 * time.Second

// reap waits for n completions and returns copies of them, in order.
func reap(t testing.TB, r *Ring, n int) []CQE {
	t.Helper()
	out := make([]CQE, 0, n)
	for len(out) < n {
		cqe, err := r.WaitCQETimeout(waitTimeout)
		if err != nil {
			t.Fatalf("waiting for completion %d of %d: %v", len(out)+1, n, err)
		}
		out = append(out, *cqe)
		r.CQESeen()
	}
	return out
}

// submitAll submits everything pending and checks that the kernel took it.
func submitAll(t testing.TB, r *Ring) {
	t.Helper()
	want := int(r.Pending())
	n, err := r.Submit()
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if n != want {
		t.Fatalf("Submit = %d, want %d", n, want)
	}
}

// run submits one prepared SQE and returns its completion.
func run(t testing.TB, r *Ring, prep func(*SQE)) CQE {
	t.Helper()
	sqe := r.GetSQE()
	if sqe == nil {
		t.Fatal("GetSQE: queue full")
	}
	prep(sqe)
	submitAll(t, r)
	return reap(t, r, 1)[0]
}

// mmapBuf returns anonymous memory, which never moves and lives until the
// end of the test: the right kind of memory to hand to the kernel.
func mmapBuf(t testing.TB, size int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

func errnoName(res int32) string {
	if res >= 0 {
		return "success"
	}
	return unix.ErrnoName(unix.Errno(-res))
}
