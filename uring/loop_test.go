package uring

import "testing"

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
