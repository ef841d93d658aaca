package uring

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const batch = 32

// nopLoop drives batches of NOPs through a ring the way a real event loop
// would: the completion handler is a method value created once.
type nopLoop struct {
	r       *Ring
	handle  func(*CQE)
	reaped  int
	badRes  int
	nextUD  uint64
	checkUD uint64
}

func newNopLoop(r *Ring) *nopLoop {
	l := &nopLoop{r: r}
	l.handle = l.complete
	return l
}

func (l *nopLoop) complete(c *CQE) {
	if c.Res != 0 || c.UserData != l.checkUD {
		l.badRes++
	}
	l.checkUD++
	l.reaped++
}

// roundTrip submits a batch of NOPs and reaps them.
func (l *nopLoop) roundTrip() error {
	for range batch {
		sqe := l.r.GetSQE()
		sqe.PrepNop(l.nextUD)
		l.nextUD++
	}
	if _, err := l.r.SubmitAndWait(batch); err != nil {
		return err
	}
	l.r.ForEachCQE(l.handle)
	return nil
}

func TestZeroAllocs(t *testing.T) {
	r := newRing(t, batch, 0)
	l := newNopLoop(r)
	var err error
	allocs := testing.AllocsPerRun(200, func() {
		if e := l.roundTrip(); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("NOP round trip of %d: %v allocations, want 0", batch, allocs)
	}
	if l.badRes != 0 || l.reaped != 201*batch {
		t.Errorf("reaped %d (bad %d), want %d", l.reaped, l.badRes, 201*batch)
	}

	// The other hot-path calls: peek/seen, wait, an empty submit, and a
	// func literal passed straight to ForEachCQE (it does not escape).
	count := 0
	allocs = testing.AllocsPerRun(200, func() {
		r.GetSQE().PrepNop(1)
		r.GetSQE().PrepNop(2)
		if _, e := r.Submit(); e != nil {
			err = e
		}
		if _, e := r.Submit(); e != nil {
			err = e
		}
		if c, e := r.WaitCQE(); e != nil || c.Res != 0 {
			err = e
		}
		r.CQESeen()
		if _, e := r.WaitCQETimeout(time.Second); e != nil {
			err = e
		}
		count += r.ForEachCQE(func(c *CQE) { count += int(c.Res) })
		_ = r.PeekCQE()
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("submit/wait/peek: %v allocations, want 0", allocs)
	}
	if count != 201 {
		t.Errorf("ForEachCQE reaped %d, want 201", count)
	}
}

// BenchmarkNopRoundTrip measures one batch of 32 NOPs: 32 GetSQE+PrepNop,
// one io_uring_enter submitting and waiting, and one ForEachCQE.
func BenchmarkNopRoundTrip(b *testing.B) {
	for _, flags := range []struct {
		name  string
		flags uint32
	}{
		{"default", 0},
		{"SingleIssuer+DeferTaskrun", SetupSingleIssuer | SetupDeferTaskrun},
	} {
		b.Run(flags.name, func(b *testing.B) {
			runtime.LockOSThread() // for SetupSingleIssuer/SetupDeferTaskrun
			defer runtime.UnlockOSThread()
			r := newRing(b, batch, flags.flags)
			l := newNopLoop(r)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.roundTrip(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/nop")
			if l.badRes != 0 {
				b.Fatalf("%d bad completions", l.badRes)
			}
		})
	}
}

// A buffer that escape analysis would keep on the goroutine stack is moved to
// the heap by the Prep methods, since the kernel keeps its address.
func TestPrepForcesHeap(t *testing.T) {
	var sqe SQE
	allocs := testing.AllocsPerRun(100, func() {
		var buf [64]byte
		sqe.PrepRead(0, unsafe.Pointer(&buf[0]), uint32(len(buf)), 0, 0)
	})
	if allocs != 1 {
		t.Errorf("PrepRead of a local array: %v allocations, want 1 (moved to the heap)", allocs)
	}
	// Memory already off the stack costs nothing.
	heap := make([]byte, 64)
	allocs = testing.AllocsPerRun(100, func() {
		sqe.PrepWrite(0, unsafe.Pointer(&heap[0]), uint32(len(heap)), 0, 0)
		var c CQE
		c.Res = -int32(unix.EAGAIN)
		if c.Err() != unix.EAGAIN {
			t.Fatal("Err")
		}
	})
	if allocs != 0 {
		t.Errorf("PrepWrite of heap memory and CQE.Err: %v allocations, want 0", allocs)
	}
}
