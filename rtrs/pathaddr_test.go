package rtrs

import (
	"errors"
	"syscall"
	"testing"
)

func TestCheckAddPath(t *testing.T) {
	paths := []PathAddr{{Dst: "a"}, {Dst: "b"}}
	removed := map[int]bool{1: true}
	live := func(i int) (PathAddr, bool) { return paths[i], !removed[i] }
	if err := CheckAddPath(PathAddr{Dst: "a"}, len(paths), live); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("a path the session has: %v, want EEXIST", err)
	}
	if err := CheckAddPath(PathAddr{Dst: "b"}, len(paths), live); err != nil {
		t.Errorf("the address of a removed path: %v, want nil", err)
	}
	if err := CheckAddPath(PathAddr{Src: "x", Dst: "a"}, len(paths), live); err != nil {
		t.Errorf("another source: %v, want nil", err)
	}
	if err := CheckAddPath(PathAddr{Dst: "c"}, MaxPathsNum, func(int) (PathAddr, bool) { return PathAddr{}, false }); !errors.Is(err, syscall.ENOMEM) {
		t.Errorf("past MaxPathsNum: %v, want ENOMEM", err)
	}
}
