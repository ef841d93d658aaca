package clientq

import (
	"testing"

	"github.com/urnbd/urnbd/rtrs"
)

type fakePath struct {
	up       bool
	inflight int64
	lat      int64
}

func (f fakePath) Usable() bool    { return f.up }
func (f fakePath) Inflight() int64 { return f.inflight }
func (f fakePath) Latency() int64  { return f.lat }

func TestSelect(t *testing.T) {
	paths := []fakePath{{true, 5, 300}, {true, 2, 900}, {false, 0, 1}, {true, 9, 100}}
	cur := 0
	if got := Select(rtrs.MinInflight, paths, &cur, -1); got != 1 {
		t.Errorf("min-inflight picked %d, want 1", got)
	}
	if got := Select(rtrs.MinLatency, paths, &cur, -1); got != 3 {
		t.Errorf("min-latency picked %d, want 3 (path 2 is down)", got)
	}
	var rr []int
	for i := 0; i < 6; i++ {
		rr = append(rr, Select(rtrs.RoundRobin, paths, &cur, -1))
	}
	if want := []int{0, 1, 3, 0, 1, 3}; !equalInts(rr, want) {
		t.Errorf("round-robin picked %v, want %v", rr, want)
	}
	if got := Select(rtrs.MinInflight, paths, &cur, 1); got != 0 {
		t.Errorf("min-inflight skipping 1 picked %d, want 0", got)
	}
	only := []fakePath{{true, 0, 0}}
	if got := Select(rtrs.MinInflight, only, &cur, 0); got != 0 {
		t.Errorf("the only usable path must be used even when skipped: %d", got)
	}
	down := []fakePath{{false, 0, 0}}
	if got := Select(rtrs.RoundRobin, down, &cur, -1); got != -1 {
		t.Errorf("no usable path: got %d", got)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
