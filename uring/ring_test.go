package uring

import (
	"errors"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestNewParams(t *testing.T) {
	p := Params{Flags: SetupCQSize, CQEntries: 64}
	r := newRingParams(t, 5, &p)
	if p.SQEntries != 8 || r.SQEntries() != 8 {
		t.Errorf("SQ entries: params %d, ring %d; want 5 rounded up to 8", p.SQEntries, r.SQEntries())
	}
	if p.CQEntries != 64 || r.CQEntries() != 64 {
		t.Errorf("CQ entries: params %d, ring %d; want 64", p.CQEntries, r.CQEntries())
	}
	if r.Features() != p.Features || r.Features()&FeatSingleMmap == 0 {
		t.Errorf("Features() = %#x, params %#x; want FeatSingleMmap", r.Features(), p.Features)
	}
	if r.Flags() != SetupCQSize || r.SQE128() || r.CQE32() {
		t.Errorf("Flags() = %#x, SQE128 %v, CQE32 %v", r.Flags(), r.SQE128(), r.CQE32())
	}
	if r.Fd() < 0 {
		t.Errorf("Fd() = %d", r.Fd())
	}
	t.Logf("features %#x, sq_off %+v, cq_off %+v", p.Features, p.SQOff, p.CQOff)

	r2 := newRing(t, 8, 0)
	if r2.CQEntries() != 16 {
		t.Errorf("default CQ entries = %d, want 2*8", r2.CQEntries())
	}
}

func TestNewErrors(t *testing.T) {
	newRing(t, 1, 0) // skips without io_uring

	_, err := New(0, 0)
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("New(0, 0) = %v, want EINVAL", err)
	}
	_, err = New(8, SetupNoMmap)
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("New(8, SetupNoMmap) = %v, want EINVAL", err)
	}
	p := Params{Resv: [3]uint32{1}}
	_, err = NewWithParams(8, &p)
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("NewWithParams with resv set = %v, want EINVAL", err)
	}
	t.Logf("error text: %v", err)
}

func TestCloseTwice(t *testing.T) {
	r, err := New(4, 0)
	skipIfNoURing(t, err)
	if err != nil {
		t.Fatal(err)
	}
	fd := r.Fd()
	if err := r.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if r.Fd() != -1 {
		t.Errorf("Fd() after Close = %d, want -1", r.Fd())
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("ring fd %d still open after Close: %v", fd, err)
	}
}

func TestNopRoundTrip(t *testing.T) {
	r := newRing(t, 8, 0)
	for i := range uint64(5) {
		r.GetSQE().PrepNop(1000 + i)
	}
	if r.Pending() != 5 {
		t.Fatalf("Pending() = %d, want 5", r.Pending())
	}
	n, err := r.SubmitAndWait(5)
	if err != nil || n != 5 {
		t.Fatalf("SubmitAndWait(5) = %d, %v", n, err)
	}
	if r.Pending() != 0 || r.CQReady() != 5 {
		t.Fatalf("after SubmitAndWait: Pending %d, CQReady %d", r.Pending(), r.CQReady())
	}
	var got []uint64
	if n := r.ForEachCQE(func(c *CQE) {
		if c.Res != 0 || c.Flags != 0 {
			t.Errorf("NOP %d: res %d flags %#x", c.UserData, c.Res, c.Flags)
		}
		got = append(got, c.UserData)
	}); n != 5 {
		t.Errorf("ForEachCQE = %d, want 5", n)
	}
	for i, ud := range got {
		if ud != 1000+uint64(i) {
			t.Errorf("CQE %d: user data %d, want %d", i, ud, 1000+i)
		}
	}
	if r.PeekCQE() != nil || r.CQReady() != 0 {
		t.Errorf("completions left after ForEachCQE")
	}

	// PeekCQE / CQESeen, and an injected result.
	sqe := r.GetSQE()
	sqe.PrepNop(77)
	sqe.OpFlags = NopInjectResult
	injected := -int32(unix.EIO)
	sqe.Len = uint32(injected)
	r.GetSQE().PrepNop(78)
	if _, err := r.SubmitAndWait(2); err != nil {
		t.Fatal(err)
	}
	c := r.PeekCQE()
	if c == nil || c.UserData != 77 || c.Res != -int32(unix.EIO) || c.Err() != unix.EIO {
		t.Fatalf("injected NOP: %+v", c)
	}
	if r.PeekCQE() != c {
		t.Errorf("PeekCQE without CQESeen moved on")
	}
	r.CQESeen()
	c = r.PeekCQE()
	if c == nil || c.UserData != 78 || c.Err() != nil {
		t.Fatalf("second NOP: %+v", c)
	}
	r.CQAdvance(1)
	if r.PeekCQE() != nil {
		t.Errorf("PeekCQE after consuming everything is not nil")
	}
}

func TestSQFull(t *testing.T) {
	r := newRing(t, 4, 0)
	if r.SQEntries() != 4 {
		t.Fatalf("SQEntries() = %d", r.SQEntries())
	}
	for round := range 3 {
		for i := range 4 {
			sqe := r.GetSQE()
			if sqe == nil {
				t.Fatalf("round %d: GetSQE %d returned nil", round, i)
			}
			sqe.PrepNop(uint64(i))
		}
		if sqe := r.GetSQE(); sqe != nil {
			t.Fatalf("round %d: GetSQE on a full queue returned an entry", round)
		}
		if r.Pending() != 4 || r.SQSpace() != 0 {
			t.Fatalf("round %d: Pending %d, SQSpace %d", round, r.Pending(), r.SQSpace())
		}
		submitAll(t, r)
		if r.Pending() != 0 || r.SQSpace() != 4 {
			t.Fatalf("round %d after Submit: Pending %d, SQSpace %d", round, r.Pending(), r.SQSpace())
		}
		for i, c := range reap(t, r, 4) {
			if c.UserData != uint64(i) || c.Res != 0 {
				t.Errorf("round %d: CQE %d = %+v", round, i, c)
			}
		}
	}
	// Nothing pending: Submit is a no-op.
	if n, err := r.Submit(); n != 0 || err != nil {
		t.Errorf("empty Submit = %d, %v", n, err)
	}
}

func TestGetSQEZeroes(t *testing.T) {
	r := newRing(t, 2, 0)
	first := r.GetSQE()
	b := (*[64]byte)(unsafe.Pointer(first))
	for i := range b {
		b[i] = 0xff
	}
	first.PrepNop(1)
	r.GetSQE().PrepNop(2)
	submitAll(t, r)
	reap(t, r, 2)
	// Dirty the slot again behind the ring's back, then get it anew.
	first.Personality = 0xffff
	first.Addr3 = 1
	again := r.GetSQE()
	if again != first {
		t.Fatalf("ring of 2 did not wrap to the first slot")
	}
	if *b != [64]byte{} {
		t.Errorf("GetSQE did not zero the entry: % x", b[:])
	}
	again.PrepNop(3)
	submitAll(t, r)
	reap(t, r, 1)
}

func TestWaitCQETimeout(t *testing.T) {
	r := newRing(t, 4, 0)
	start := time.Now()
	cqe, err := r.WaitCQETimeout(20 * time.Millisecond)
	if cqe != nil || !errors.Is(err, unix.ETIME) {
		t.Fatalf("WaitCQETimeout on an empty ring = %v, %v; want ETIME", cqe, err)
	}
	if d := time.Since(start); d < 15*time.Millisecond {
		t.Errorf("WaitCQETimeout returned after %v", d)
	}
	r.GetSQE().PrepNop(5)
	submitAll(t, r)
	cqe, err = r.WaitCQE()
	if err != nil || cqe.UserData != 5 {
		t.Fatalf("WaitCQE = %+v, %v", cqe, err)
	}
	r.CQESeen()
}

func TestProbe(t *testing.T) {
	r := newRing(t, 4, 0)
	p, err := r.Probe()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel knows opcodes up to %d", p.LastOp)
	for _, op := range []uint8{OpNop, OpRead, OpWrite, OpFsync, OpFallocate, OpPollAdd, OpTimeout, OpAsyncCancel, OpUringCmd} {
		if !p.Supported(op) {
			t.Errorf("opcode %d not supported", op)
		}
	}
	if p.Supported(255) {
		t.Errorf("opcode 255 supported")
	}
}

func TestDisabledRing(t *testing.T) {
	r := newRing(t, 4, SetupRDisabled)
	r.GetSQE().PrepNop(1)
	_, err := r.Submit()
	if !errors.Is(err, unix.EBADFD) {
		t.Fatalf("Submit on a disabled ring = %v, want EBADFD", err)
	}
	if err := r.EnableRings(); err != nil {
		t.Fatal(err)
	}
	if r.Pending() != 1 {
		t.Fatalf("Pending() = %d, want the NOP still pending", r.Pending())
	}
	submitAll(t, r)
	if c := reap(t, r, 1)[0]; c.UserData != 1 || c.Res != 0 {
		t.Errorf("CQE %+v", c)
	}
}

// ringFlagsCase runs a burst of NOPs through a ring set up with flags.
func nopBurst(t *testing.T, r *Ring, n int) {
	t.Helper()
	for i := range n {
		r.GetSQE().PrepNop(uint64(i))
	}
	if s, err := r.SubmitAndWait(uint32(n)); err != nil || s != n {
		t.Fatalf("SubmitAndWait(%d) = %d, %v", n, s, err)
	}
	i := 0
	r.ForEachCQE(func(c *CQE) {
		if c.UserData != uint64(i) || c.Res != 0 {
			t.Errorf("CQE %d = %+v", i, *c)
		}
		i++
	})
	if i != n {
		t.Errorf("reaped %d, want %d", i, n)
	}
}

func TestSetupFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags uint32
	}{
		{"NoSQArray", SetupNoSQArray},
		{"CoopTaskrun", SetupCoopTaskrun | SetupTaskrunFlag},
		{"SingleIssuerDeferTaskrun", SetupSingleIssuer | SetupDeferTaskrun},
		{"SingleIssuerDeferCoopTaskrun", SetupSingleIssuer | SetupDeferTaskrun | SetupCoopTaskrun},
		{"SubmitAll", SetupSubmitAll | SetupClamp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Task work and the single issuer are bound to a kernel
			// task, that is an OS thread.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := newRing(t, 8, tc.flags)
			for range 4 {
				nopBurst(t, r, 8)
			}
		})
	}
}

func TestSQPoll(t *testing.T) {
	p := Params{Flags: SetupSQPoll, SQThreadIdle: 1}
	r, err := NewWithParams(8, &p)
	skipIfNoURing(t, err)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	nopBurst(t, r, 4)
	// Let the polling thread go idle, so that submitting has to wake it.
	deadline := time.Now().Add(waitTimeout)
	for r.SQFlags()&SQNeedWakeup == 0 {
		if time.Now().After(deadline) {
			t.Fatal("SQPOLL thread never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
	r.GetSQE().PrepNop(99)
	if n, err := r.Submit(); n != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if c := reap(t, r, 1)[0]; c.UserData != 99 {
		t.Errorf("CQE %+v", c)
	}
}
