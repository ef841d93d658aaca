package tcp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
)

// TestSessionFixedReads reads answers of several sizes, interleaved on one
// connection, into fixed buffers of the queue's ring (Request.Fixed): what
// Split says is in Data and what is in the fixed buffer must together be
// the data, the large answers must have gone (mostly) into the fixed
// buffer and those under directRecvMin not at all, and no frame may be
// misread.
func TestSessionFixedReads(t *testing.T) {
	b := newMemBackend(4 << 20)
	rand.New(rand.NewSource(1)).Read(b.mem)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 1, addr)
	q := c.Queue(0)

	sizes := []int{48 << 10, 512, 60 << 10, 4096, 20 << 10}
	const perSize, rounds = 4, 40
	n := len(sizes) * perSize
	type slot struct {
		r     Request
		usr   [8]byte
		fixed []byte
		off   int
		left  int
	}
	slots := make([]slot, n)
	iovs := make([]unix.Iovec, n)
	rng := rand.New(rand.NewSource(2))
	for i := range slots {
		s := &slots[i]
		size := sizes[i%len(sizes)]
		s.fixed = make([]byte, size)
		s.r = Request{Data: make([]byte, size), Usr: s.usr[:], Fixed: true, BufIndex: uint16(i), Tag: uint64(i),
			FixedBase: uint64(uintptr(unsafe.Pointer(&s.fixed[0])))}
		s.left = rounds
		iovs[i].Base, iovs[i].Len = &s.fixed[0], uint64(size)
	}
	var errs []string
	direct := make(map[int]int) // by size: answers that went into the fixed buffer
	done := make(chan struct{})
	running := n
	var submit func(i int)
	end := func() {
		if running--; running == 0 {
			close(done)
		}
	}
	onDone := func(r *Request, errno int) {
		i := int(r.Tag)
		s := &slots[i]
		size := len(r.Data)
		if errno != 0 {
			errs = append(errs, fmt.Sprintf("slot %d: errno %d", i, errno))
			end()
			return
		}
		if r.Split < 0 || r.Split > size {
			errs = append(errs, fmt.Sprintf("slot %d: split %d of %d", i, r.Split, size))
			end()
			return
		}
		got := append(append([]byte(nil), r.Data[:r.Split]...), s.fixed[r.Split:]...)
		if !bytes.Equal(got, b.mem[s.off:s.off+size]) {
			errs = append(errs, fmt.Sprintf("slot %d (%d bytes, split %d): data differs", i, size, r.Split))
		}
		if r.Split < size {
			direct[size]++
		}
		if s.left--; s.left == 0 {
			end()
			return
		}
		submit(i)
	}
	submit = func(i int) {
		s := &slots[i]
		size := len(s.r.Data)
		// Stale bytes in either buffer would show.
		for j := range s.fixed {
			s.fixed[j], s.r.Data[j] = 0xee, 0xdd
		}
		s.off = rng.Intn(len(b.mem)-size) &^ 511
		binary.LittleEndian.PutUint64(s.usr[:], uint64(s.off))
		s.r.Done = onDone
		if err := q.Submit(&s.r); err != nil {
			errs = append(errs, fmt.Sprintf("submit: %v", err))
			end()
		}
	}
	registered := make(chan error, 1)
	onQueue(q, func(q *ClientQueue) {
		err := q.core.Ring.RegisterBuffers(iovs)
		registered <- err
		if err != nil {
			return
		}
		for i := range slots {
			submit(i)
		}
	})
	if err := <-registered; err != nil {
		t.Fatalf("register fixed buffers: %v", err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reads not done after 30s")
	}
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %s", len(errs), errs[0])
	}
	// Whether an answer's rest goes into the fixed buffer depends on how
	// much of it the header's read took (timing), so only the sum over
	// the large sizes must be above 0; small ones never go there.
	largeDirect := 0
	for _, size := range sizes {
		if size >= 2*directRecvMin {
			largeDirect += direct[size]
		}
		if size < directRecvMin && direct[size] != 0 {
			t.Errorf("%d-byte answers: %d went into the fixed buffer", size, direct[size])
		}
	}
	if largeDirect == 0 {
		t.Errorf("no large answer went into the fixed buffer: %v", direct)
	}
	if got := string(c.Paths()[0].Stats.AppendReconnects(nil)); got != "0 0\n" {
		t.Errorf("reconnects %q, want none", got)
	}
}
