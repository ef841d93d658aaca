package ublk

import (
	"bytes"
	"math/rand"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/uring"
)

// copyResults is a QueueHandler that records the copies' results.
type copyResults map[uint64]int32

func (c copyResults) Handle(uint16, *Request)                     { panic("no requests here") }
func (c copyResults) OnCompletion(ud uint64, res int32, _ uint32) { c[ud] = res }
func (c copyResults) Close() error                                { return nil }

// newCopyTestQueue is a zero-copy queue whose "request pages" are user
// memory registered as fixed buffers 0..registered-1 of a real ring.
func newCopyTestQueue(t *testing.T, depth, registered, maxIO int) (*Queue, [][]byte, copyResults) {
	t.Helper()
	ring, err := uring.New(64, 0)
	if err != nil {
		t.Skipf("io_uring: %v", err)
	}
	t.Cleanup(func() { ring.Close() })
	pages := make([][]byte, registered)
	iovs := make([]unix.Iovec, registered)
	res := copyResults{}
	q := &Queue{ring: ring, depth: depth, maxIO: maxIO, autoBufReg: true, handler: res}
	q.copier.base = make([]uint64, depth)
	for i := range pages {
		pages[i] = make([]byte, maxIO)
		iovs[i].Base = &pages[i][0]
		iovs[i].SetLen(maxIO)
		q.copier.base[i] = uint64(uintptr(unsafe.Pointer(&pages[i][0])))
	}
	if err := ring.RegisterBuffers(iovs); err != nil {
		t.Fatalf("register buffers: %v", err)
	}
	t.Cleanup(q.copier.close)
	return q, pages, res
}

// reap submits and handles completions until n copies have reported.
func reap(t *testing.T, q *Queue, res copyResults, n int) {
	t.Helper()
	for len(res) < n {
		if _, err := q.ring.SubmitAndWait(1); err != nil {
			t.Fatal(err)
		}
		q.ring.ForEachCQE(q.handleCQE)
	}
}

func TestCopyThroughPipe(t *testing.T) {
	const maxIO = 128 << 10
	q, pages, res := newCopyTestQueue(t, 8, 4, maxIO)
	rng := rand.New(rand.NewSource(1))
	// In one submission: into tags 0 and 2, out of tags 1 and 3, of
	// sizes up to a whole request.
	in0, in2 := make([]byte, 5000), make([]byte, maxIO)
	rng.Read(in0)
	rng.Read(in2)
	rng.Read(pages[1])
	rng.Read(pages[3])
	out1, out3 := make([]byte, 4096), make([]byte, maxIO-512)
	q.CopyToRequest(0, 100, in0, 10)
	q.CopyFromRequest(1, 7, out1, 11)
	q.CopyToRequest(2, 0, in2, 12)
	q.CopyFromRequest(3, 512, out3, 13)
	reap(t, q, res, 4)
	for ud, want := range map[uint64]int32{10: 5000, 11: 4096, 12: maxIO, 13: maxIO - 512} {
		if res[ud] != want {
			t.Errorf("copy %d: result %d, want %d", ud, res[ud], want)
		}
	}
	if !bytes.Equal(pages[0][100:5100], in0) || !bytes.Equal(pages[2], in2) {
		t.Error("data copied into a request differs")
	}
	if !bytes.Equal(out1, pages[1][7:4103]) || !bytes.Equal(out3, pages[3][512:]) {
		t.Error("data copied out of a request differs")
	}
}

func TestCopyRefused(t *testing.T) {
	q, _, res := newCopyTestQueue(t, 8, 2, 4096)
	q.CopyToRequest(0, 4000, make([]byte, 200), 1) // beyond the request
	q.CopyToRequest(1, 0, nil, 2)
	reap(t, q, res, 2)
	for ud := range uint64(2) {
		if res[ud+1] != -int32(unix.EINVAL) {
			t.Errorf("copy %d: result %d, want -EINVAL", ud+1, res[ud+1])
		}
	}
}

// A copy that fails after its bytes went into its pipe (here: into a tag
// with no fixed buffer) reports an errno, and the pipe it leaves bytes in
// is not used again: later copies get exactly their own data.
func TestCopyFailedHalfWay(t *testing.T) {
	q, pages, res := newCopyTestQueue(t, 8, 1, 4096)
	stale, good := bytes.Repeat([]byte{0xaa}, 1000), bytes.Repeat([]byte{0x55}, 1000)
	q.CopyToRequest(5, 0, stale, 1) // tag 5 has no fixed buffer
	q.CopyToRequest(0, 0, good, 2)
	reap(t, q, res, 2)
	if res[1] >= 0 {
		t.Errorf("copy into an unregistered buffer: result %d, want an errno", res[1])
	}
	if res[2] != 1000 || !bytes.Equal(pages[0][:1000], good) {
		t.Errorf("copy beside it: result %d, data equal %v", res[2], bytes.Equal(pages[0][:1000], good))
	}
	for i := range 4 {
		clear(pages[0])
		q.CopyToRequest(0, 0, good, uint64(3+i))
		reap(t, q, res, 3+i)
		if res[uint64(3+i)] != 1000 || !bytes.Equal(pages[0][:1000], good) || bytes.Contains(pages[0], stale[:8]) {
			t.Fatalf("copy %d after the failure: result %d, data equal %v", i, res[uint64(3+i)], bytes.Equal(pages[0][:1000], good))
		}
	}
	if n := len(q.copier.free); n != 1 {
		t.Errorf("%d pipes in the pool, want 1 (the failed copy's closed)", n)
	}
}
