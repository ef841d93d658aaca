package uring

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestBufRing reads a pipe with buffers picked by the kernel from a
// two-entry ring, giving each back after use: more rounds than entries, so
// the tail wraps and entry 0 (whose bid shares a word with the tail) is
// rewritten.
func TestBufRing(t *testing.T) {
	r := newRing(t, 8, 0)
	const nbufs, size, group = 2, 64, 7
	br, err := r.RegisterBufRing(nbufs, group)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("kernel without provided buffer rings (Linux 5.19+): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := br.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	if br.Group() != group {
		t.Fatalf("Group = %d, want %d", br.Group(), group)
	}
	mem := mmapBuf(t, nbufs*size)
	buf := func(bid uint16) []byte { return mem[int(bid)*size : int(bid+1)*size] }
	for bid := uint16(0); bid < nbufs; bid++ {
		br.Add(unsafe.Pointer(&buf(bid)[0]), size, bid)
	}
	br.Advance()

	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	seen := map[uint16]int{}
	for round := 0; round < 5; round++ {
		msg := []byte{'m', byte('0' + round)}
		if _, err := unix.Write(p[1], msg); err != nil {
			t.Fatal(err)
		}
		c := run(t, r, func(s *SQE) {
			s.PrepRead(int32(p[0]), nil, size, 0, uint64(round))
			s.Flags |= SQEBufferSelect
			s.BufIndex = group
		})
		expectRes(t, "read into a provided buffer", c, int32(len(msg)))
		if c.Flags&CQEFBuffer == 0 {
			t.Fatalf("round %d: CQE flags %#x without CQEFBuffer", round, c.Flags)
		}
		bid := c.BufferID()
		if bid >= nbufs {
			t.Fatalf("round %d: buffer ID %d, ring has %d", round, bid, nbufs)
		}
		if got := string(buf(bid)[:len(msg)]); got != string(msg) {
			t.Fatalf("round %d: buffer %d holds %q, want %q", round, bid, got, msg)
		}
		seen[bid]++
		br.Add(unsafe.Pointer(&buf(bid)[0]), size, bid)
		br.Advance()
	}
	if len(seen) != nbufs {
		t.Fatalf("buffers used %v: want both", seen)
	}

	// Two reads take both buffers and keep them; the third finds the ring
	// empty and fails with ENOBUFS rather than wait.
	if _, err := unix.Write(p[1], []byte("xyz")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		c := run(t, r, func(s *SQE) {
			s.PrepRead(int32(p[0]), nil, 1, 0, uint64(100+i))
			s.Flags |= SQEBufferSelect
			s.BufIndex = group
		})
		want := int32(1)
		if i == nbufs {
			want = -int32(unix.ENOBUFS)
		}
		expectRes(t, "read one byte", c, want)
	}
}

func TestRegisterBufRingRejectsBadSize(t *testing.T) {
	r := newRing(t, 8, 0)
	for _, n := range []uint32{0, 3, 1 << 16} {
		if _, err := r.RegisterBufRing(n, 1); !errors.Is(err, unix.EINVAL) {
			t.Errorf("RegisterBufRing(%d): %v, want EINVAL", n, err)
		}
	}
}
