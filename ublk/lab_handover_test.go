package ublk_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/ublk"
	"github.com/urnbd/urnbd/uring"
)

// slowMemory is a memory-backed target that writes a request's data at
// once but completes the request only after a delay (a timeout on the
// queue's ring), as a network target completes when its server answers.
// It counts the writes of each block; both servers of a handover share it.
type slowMemory struct {
	mu       sync.Mutex
	data     []byte
	writes   map[int64]int // block → writes handled
	inflight atomic.Int64  // handled, not completed
	handled  atomic.Int64
}

type slowQueue struct {
	m    *slowMemory
	q    *ublk.Queue
	ts   []uring.KernelTimespec
	lens []int32
}

func (m *slowMemory) NewQueue(q *ublk.Queue) (ublk.QueueHandler, error) {
	return &slowQueue{m: m, q: q, ts: make([]uring.KernelTimespec, q.Depth()), lens: make([]int32, q.Depth())}, nil
}

func (h *slowQueue) Handle(tag uint16, req *ublk.Request) {
	m := h.m
	m.handled.Add(1)
	m.inflight.Add(1)
	off := req.Offset()
	m.mu.Lock()
	switch req.Op {
	case ublk.OpWrite:
		copy(m.data[off:], req.Buf)
		for b := off; b < off+int64(req.Len()); b += 4096 {
			m.writes[b/4096]++
		}
	case ublk.OpRead:
		copy(req.Buf, m.data[off:])
	}
	m.mu.Unlock()
	h.lens[tag] = int32(req.Len())
	h.ts[tag] = uring.NsecToTimespec(int64(20 * time.Millisecond))
	h.q.GetSQE().PrepTimeout(&h.ts[tag], 0, 0, ublk.TargetUserData(uint64(tag)))
}

func (h *slowQueue) OnCompletion(userData uint64, _ int32, _ uint32) {
	tag := uint16(ublk.TargetValue(userData))
	h.m.inflight.Add(-1)
	h.q.Complete(tag, h.lens[tag])
}

func (h *slowQueue) Close() error { return nil }

// TestLabHandover hands a device under writes over to a second target
// (Device.Handover, then Recover) in one process: every write the first
// target was handed completes there and is not issued again to the
// second; the writes wait while no server serves the device, and none
// fails. The per-tag protocol uses the driver's quiesce where it has it
// (7.x); batch I/O, and 6.12, have the queues hold back what arrives. Each
// writer writes each block once, so a block written twice is a request
// issued twice. Both queue protocols where the driver has batch I/O.
func TestLabHandover(t *testing.T) {
	ctrl := openControl(t)
	offered, err := ctrl.Features()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("per-tag", func(t *testing.T) { testHandover(t, ctrl, offered, true) })
	if offered&ublk.FlagBatchIO != 0 {
		t.Run("batch", func(t *testing.T) { testHandover(t, ctrl, offered, false) })
	}
}

func testHandover(t *testing.T, ctrl *ublk.Control, offered uint64, noBatch bool) {
	start := time.Now()
	const size = 16 << 20
	mem := &slowMemory{data: make([]byte, size), writes: map[int64]int{}}
	dev := create(t, ctrl, ublk.Options{ID: -1, Size: size, Queues: 2, Depth: 8, NoBatchIO: noBatch}, mem)
	if got, want := dev.Info().Flags&ublk.FlagQuiesce != 0, offered&ublk.FlagQuiesce != 0; got != want {
		t.Fatalf("quiesce negotiated %v, offered %v", got, want)
	}

	// Four writers, each through its own quarter, one 4 KiB block at a
	// time, each block stamped with its number.
	const writers, perWriter = 4, size / 4096 / 4
	var written atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	var files []*os.File
	t.Cleanup(func() { // before create's: a device open cannot be deleted
		for _, f := range files {
			f.Close()
		}
	})
	for w := 0; w < writers; w++ {
		f, buf := openDirect(t, ublk.BlockPath(dev.ID()))
		files = append(files, f)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				select {
				case <-stop:
					return
				default:
				}
				blk := int64(w*perWriter + i)
				binary.LittleEndian.PutUint64(buf, uint64(blk)+1)
				if _, err := unix.Pwrite(int(f.Fd()), buf, blk*4096); err != nil {
					errs <- fmt.Errorf("block %d at %v: %w", blk, time.Since(start), err)
					return
				}
				written.Add(1)
			}
		}(w)
	}
	defer func() { close(stop); wg.Wait() }()

	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Logf("handover at %v", time.Since(start))
	res, err := dev.Handover(ctx)
	t.Logf("handover done at %v", time.Since(start))
	if err != nil {
		t.Fatalf("handover: %v", err)
	}
	if want := offered&ublk.FlagQuiesce != 0 && noBatch; res.Quiesced != want || res.QuiesceErr != nil {
		t.Errorf("handover quiesced %v (%v); want %v (quiesce offered: %v, per-tag protocol: %v)", res.Quiesced, res.QuiesceErr, want, offered&ublk.FlagQuiesce != 0, noBatch)
	}
	if n := mem.inflight.Load(); n != 0 {
		t.Errorf("handover returned with %d requests still with the target", n)
	}
	if !labtest.WaitFor(10*time.Second, func() bool {
		info, err := ctrl.DevInfo(dev.ID())
		return err == nil && info.State == ublk.StateQuiesced
	}) {
		info, _ := ctrl.DevInfo(dev.ID())
		t.Fatalf("device state %s after the handover, want quiesced", ublk.StateName(info.State))
	}
	before, handledBefore := written.Load(), mem.handled.Load()
	time.Sleep(500 * time.Millisecond)
	if n := written.Load(); n != before {
		t.Errorf("%d writes completed while no server served the device", n-before)
	}
	if n := mem.handled.Load(); n != handledBefore {
		t.Errorf("the first target was handed %d requests after the handover", n-handledBefore)
	}

	dev2, err := ublk.Recover(ctrl, dev.ID(), mem, nil)
	if err != nil {
		t.Fatalf("recover after the handover: %v", err)
	}
	t.Logf("recovered at %v", time.Since(start))
	if !labtest.WaitFor(10*time.Second, func() bool { return written.Load() > before+100 || len(errs) > 0 }) || len(errs) > 0 {
		for len(errs) > 0 {
			t.Errorf("write: %v", <-errs)
		}
		t.Fatalf("writes did not go on after the recovery (%d → %d)", before, written.Load())
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	select {
	case err := <-errs:
		t.Fatalf("write: %v", err)
	default:
	}

	mem.mu.Lock()
	defer mem.mu.Unlock()
	twice := 0
	for blk, n := range mem.writes {
		if n != 1 {
			twice++
			if twice < 5 {
				t.Errorf("block %d written %d times", blk, n)
			}
		}
		if got := binary.LittleEndian.Uint64(mem.data[blk*4096:]); got != uint64(blk)+1 {
			t.Errorf("block %d holds %d", blk, got)
		}
	}
	if twice > 0 || int64(len(mem.writes)) < written.Load() {
		t.Errorf("%d blocks written more than once; %d blocks written of %d writes completed", twice, len(mem.writes), written.Load())
	}
	t.Logf("%d writes, %d before the handover (quiesce: %v); each block written once", written.Load(), before, res.Quiesced)
	for _, f := range files {
		f.Close()
	}
	files = nil
	if err := dev2.Delete(); err != nil {
		t.Errorf("delete: %v", err)
	}
	if _, err := os.Stat(ublk.BlockPath(dev.ID())); err == nil {
		t.Error("the block device outlived its delete")
	}
}
