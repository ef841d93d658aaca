package ublk_test

import (
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/ublk"
)

// eventTarget completes requests only when an eventfd fires, polled through
// the queue's own ring: the pattern of a network transport whose socket or
// completion channel completes into the queue's io_uring.
type eventTarget struct {
	efd   int
	fired atomic.Int64 // wake-ups handled, over all queues
}

type eventQueue struct {
	t       *eventTarget
	q       *ublk.Queue
	pending []uint16
	lens    []int32
	buf     [8]byte
}

func (t *eventTarget) NewQueue(q *ublk.Queue) (ublk.QueueHandler, error) {
	h := &eventQueue{t: t, q: q, pending: make([]uint16, 0, q.Depth()), lens: make([]int32, q.Depth())}
	h.arm()
	return h, nil
}

func (h *eventQueue) arm() {
	h.q.GetSQE().PrepPollAdd(int32(h.t.efd), unix.POLLIN, false, ublk.TargetUserData(1))
}

func (h *eventQueue) Handle(tag uint16, req *ublk.Request) {
	h.lens[tag] = int32(req.Len())
	h.pending = append(h.pending, tag)
	// Someone else (here: this thread, for simplicity) signals later.
	unix.Write(h.t.efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
}

func (h *eventQueue) OnCompletion(userData uint64, res int32, _ uint32) {
	if res < 0 {
		return
	}
	// The eventfd is shared by the queues; whoever reads it completes its
	// own pending requests, and every queue completes on any wake-up.
	unix.Read(h.t.efd, h.buf[:])
	h.t.fired.Add(1)
	for _, tag := range h.pending {
		h.q.Complete(tag, h.lens[tag])
	}
	h.pending = h.pending[:0]
	h.arm() // one-shot poll: arm it again
}

func (h *eventQueue) Close() error { return nil }

func TestLabTargetCompletesFromAnotherEventSource(t *testing.T) {
	ctrl := openControl(t)
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	target := &eventTarget{efd: efd}
	dev := create(t, ctrl, ublk.Options{ID: -1, Size: 64 << 20, Queues: 1, Depth: 16}, target)
	res, stderr, err := labtest.Fio(t, "--name=event", "--filename="+ublk.BlockPath(dev.ID()),
		"--ioengine=io_uring", "--direct=1", "--rw=randread", "--bs=4k", "--iodepth=8", "--number_ios=2000")
	if err != nil || res.Errors() != 0 || res.IOs() != 2000 {
		t.Fatalf("fio: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	if target.fired.Load() == 0 {
		t.Fatal("no request was completed from the eventfd's poll")
	}
	t.Logf("%d I/Os completed from %d eventfd wake-ups", res.IOs(), target.fired.Load())
}
