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

// Reserve leaves room for a whole chain: with one entry free it submits
// the pending ones, and a linked pair prepared after it runs as a chain
// (a failed head cancels its tail).
func TestReserveKeepsChainWhole(t *testing.T) {
	r := newRing(t, 4, 0)
	for r.SQSpace() > 1 {
		r.GetSQE().PrepNop(1)
	}
	if err := r.Reserve(2); err != nil {
		t.Fatal(err)
	}
	if r.SQSpace() < 2 {
		t.Fatalf("Reserve(2) left %d entries free", r.SQSpace())
	}
	head := r.GetSQE()
	head.PrepPollRemove(12345, 2) // no such poll: fails with ENOENT
	head.Flags |= SQEIOLink
	r.GetSQE().PrepNop(3)
	if _, err := r.SubmitAndWait(2); err != nil {
		t.Fatal(err)
	}
	res := map[uint64]int32{}
	ended := func() bool { _, h := res[2]; _, t := res[3]; return h && t }
	for !ended() {
		r.ForEachCQE(func(c *CQE) { res[c.UserData] = c.Res })
		if !ended() {
			if _, err := r.SubmitAndWait(1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if res[2] >= 0 || res[3] != -125 { // ECANCELED
		t.Errorf("head %d, tail %d: want the head failed and its linked tail cancelled", res[2], res[3])
	}
}
