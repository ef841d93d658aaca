package ublk

import (
	"errors"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// newBatchTestQueue is a queue in the batch protocol with no ring: enough
// for the commit bookkeeping, which touches no ring.
func newBatchTestQueue(elemWords int) *Queue {
	q := &Queue{depth: 8, maxIO: 4096, bufs: make([]byte, 8*4096)}
	q.batch = &batchQueue{elemWords: elemWords}
	for i := range q.batch.commits {
		q.batch.commits[i] = make([]uint64, q.depth*elemWords)
	}
	return q
}

// inFlight puts a commit of tags in slot 0, as flushCommits does, and makes
// slot 1 the one being filled.
func inFlight(q *Queue, tags ...uint16) {
	b := q.batch
	for i, tag := range tags {
		b.putElem(b.commits[0], i, tag, 4096, q.bufAddr(tag))
	}
	b.busy[0], b.queued[0], b.inflight, b.cur = true, len(tags), 1, 1
}

func pendingTags(q *Queue) []uint16 {
	b := q.batch
	var tags []uint16
	for i := range b.pending {
		tags = append(tags, b.elemTag(b.commits[b.cur], i))
	}
	return tags
}

func TestHandleCommit(t *testing.T) {
	for _, ew := range []int{1, 2} {
		for _, tc := range []struct {
			name    string
			res     int32 // as the driver answers, for 5 elements
			aborted bool
			pending []uint16 // committed again
			err     bool
		}{
			{"all", int32(5 * 8 * ew), false, nil, false},
			{"stops at the third", int32(2 * 8 * ew), false, []uint16{4, 5}, true},
			{"refuses the first", -int32(unix.EBUSY), false, []uint16{2, 3, 4, 5}, true},
			{"refuses the last", int32(4 * 8 * ew), false, nil, true},
			{"stopping", -int32(unix.EBUSY), true, []uint16{2, 3, 4, 5}, false},
		} {
			q := newBatchTestQueue(ew)
			q.batch.aborted = tc.aborted
			inFlight(q, 1, 2, 3, 4, 5)
			q.handleCommit(0, tc.res)
			b := q.batch
			if b.busy[0] || b.inflight != 0 {
				t.Errorf("%d words, %s: slot still busy (%v, %d in flight)", ew, tc.name, b.busy[0], b.inflight)
			}
			if got := pendingTags(q); !slices.Equal(got, tc.pending) {
				t.Errorf("%d words, %s: committed again %v, want %v", ew, tc.name, got, tc.pending)
			}
			if (q.err != nil) != tc.err || (q.err != nil && !errors.Is(q.err, unix.EIO)) {
				t.Errorf("%d words, %s: queue error %v, want one: %v", ew, tc.name, q.err, tc.err)
			}
			// A requeued element keeps its result and buffer address.
			if len(tc.pending) > 0 {
				w := b.commits[b.cur][:ew]
				if h := (*ElemHeader)(unsafe.Pointer(&w[0])); h.Result != 4096 || h.BufIndex != tc.pending[0] {
					t.Errorf("%d words, %s: requeued element %+v", ew, tc.name, *h)
				}
				if ew == 2 && w[1] != q.bufAddr(tc.pending[0]) {
					t.Errorf("%d words, %s: requeued buffer address %#x, want %#x", ew, tc.name, w[1], q.bufAddr(tc.pending[0]))
				}
			}
		}
	}
}

// Complete fills the slot being filled; flushing waits while every other
// slot is in flight.
func TestCompleteBatchAccounting(t *testing.T) {
	q := newBatchTestQueue(2)
	b := q.batch
	q.handed = 3
	for _, tag := range []uint16{7, 0, 3} {
		q.Complete(tag, 512)
	}
	if q.handed != 0 || b.pending != 3 || !slices.Equal(pendingTags(q), []uint16{7, 0, 3}) {
		t.Fatalf("handed %d, pending %v", q.handed, pendingTags(q))
	}
	for i := range b.busy {
		b.busy[i] = i != b.cur
	}
	q.flushCommits() // no free slot: nothing is queued, and no ring is needed
	if b.pending != 3 {
		t.Errorf("flush without a free slot dropped the pending elements: %d left", b.pending)
	}
	if !q.running() {
		t.Error("a queue with elements to commit reports it is done")
	}
}
