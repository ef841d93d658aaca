package clientq

import (
	"slices"
	"testing"
)

func TestUnfenced(t *testing.T) {
	var u Unfenced[int]
	for _, c := range []int{1, 2, 3, 4} {
		u.Hold(c)
	}
	var out []int
	u.Release(func(c int) bool { return c%2 == 0 }, func(c int) { out = append(out, c) })
	if !slices.Equal(out, []int{2, 4}) || u.Len() != 2 {
		t.Fatalf("released %v, %d left", out, u.Len())
	}
	out = nil
	u.Release(func(int) bool { return true }, func(c int) { out = append(out, c) })
	if !slices.Equal(out, []int{1, 3}) || u.Len() != 0 {
		t.Fatalf("released %v, %d left", out, u.Len())
	}
}
