package chunkgate

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestChunkGateQueuesInOrder(t *testing.T) {
	g := New[string](4)
	if !g.Enter(2, "stale") {
		t.Fatal("free chunk: Enter = false")
	}
	if !g.Enter(3, "other") {
		t.Fatal("chunks are independent: Enter(3) = false")
	}
	if g.Enter(2, "resent") || g.Enter(2, "again") {
		t.Fatal("held chunk: Enter = true")
	}
	if n := g.Waiting(2); n != 2 {
		t.Fatalf("Waiting = %d, want 2", n)
	}
	for _, want := range []string{"resent", "again"} {
		next, ok := g.Leave(2)
		if !ok || next != want {
			t.Fatalf("Leave = %q, %v; want %q, true", next, ok, want)
		}
	}
	if next, ok := g.Leave(2); ok {
		t.Fatalf("Leave of the last holder handed the chunk to %q", next)
	}
	if !g.Enter(2, "later") {
		t.Fatal("chunk not free after the last Leave")
	}
}

// TestChunkGateExclusive runs requests on few chunks from many goroutines
// and checks that no two ever hold one chunk at once and none is lost.
func TestChunkGateExclusive(t *testing.T) {
	const chunks, workers, rounds = 3, 8, 2000
	g := New[int](chunks)
	var holders [chunks]atomic.Int32
	var ran atomic.Int64
	var wg sync.WaitGroup
	// run holds chunk id for a request, then passes it on as a server's
	// Complete would, running whoever waited.
	run := func(id int) {
		for {
			if holders[id].Add(1) != 1 {
				t.Errorf("chunk %d held twice", id)
			}
			ran.Add(1)
			holders[id].Add(-1)
			if _, ok := g.Leave(id); !ok {
				return
			}
		}
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				id := (w + i) % chunks
				if g.Enter(id, w*rounds+i) {
					run(id)
				}
			}
		}(w)
	}
	wg.Wait()
	if got := ran.Load(); got != workers*rounds {
		t.Fatalf("%d requests ran, want %d", got, workers*rounds)
	}
	for id := 0; id < chunks; id++ {
		if !g.Enter(id, 0) {
			t.Fatalf("chunk %d not free at the end", id)
		}
	}
}

func BenchmarkChunkGate(b *testing.B) {
	g := New[*int](512)
	r := new(int)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		id := i & 511
		if g.Enter(id, r) {
			g.Leave(id)
		}
	}
}
