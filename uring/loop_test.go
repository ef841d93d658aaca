package uring

import (
	"runtime"
	"testing"
)

// NextSQE makes room in a full submission queue by submitting it: the
// entries already taken all complete, and the next one is the caller's.
func TestNextSQEMakesRoom(t *testing.T) {
	r := newRing(t, 4, 0)
	n := 0
	for ; r.GetSQE() != nil; n++ {
	}
	// The entries GetSQE handed out are zeroed: IORING_OP_NOP.
	s, err := r.NextSQE()
	if err != nil || s == nil {
		t.Fatalf("NextSQE on a full queue: %v, %v", s, err)
	}
	s.PrepNop(99)
	if _, err := r.SubmitAndWait(uint32(n + 1)); err != nil {
		t.Fatal(err)
	}
	got := 0
	r.ForEachCQE(func(c *CQE) { got++ })
	if got != n+1 {
		t.Errorf("%d completions, want the %d entries of the full queue and the one after", got, n+1)
	}
}

func TestNewLoop(t *testing.T) {
	r, err := NewLoop(8)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	defer r.Close()
	if s, err := r.NextSQE(); err != nil || s == nil {
		t.Fatalf("NextSQE on a new loop ring: %v, %v", s, err)
	}
}

// Each open loop ring counts one more P in GOMAXPROCS, and closing them
// gives the P back.
func TestNewLoopHoldsAP(t *testing.T) {
	base := runtime.GOMAXPROCS(0)
	var loops []*Ring
	for i := 1; i <= 3; i++ {
		r, err := NewLoop(8)
		if err != nil {
			t.Skipf("io_uring unavailable here: %v", err)
		}
		loops = append(loops, r)
		if got := runtime.GOMAXPROCS(0); got != base+i {
			t.Fatalf("GOMAXPROCS with %d loops = %d, want %d", i, got, base+i)
		}
	}
	for i, r := range loops {
		r.Close()
		r.Close() // a second Close gives back nothing more
		if got, want := runtime.GOMAXPROCS(0), base+len(loops)-i-1; got != want {
			t.Fatalf("GOMAXPROCS after closing %d loops = %d, want %d", i+1, got, want)
		}
	}
	if r, err := New(8, 0); err == nil {
		if got := runtime.GOMAXPROCS(0); got != base {
			t.Errorf("GOMAXPROCS with a ring that is not a loop's = %d, want %d", got, base)
		}
		r.Close()
	}
}
