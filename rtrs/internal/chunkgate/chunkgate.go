// Package chunkgate serialises the use of a server chunk by the requests of
// one RTRS session across its paths (see Gate). It knows nothing of the
// transport that carries the requests.
package chunkgate

import (
	"sync"
	"sync/atomic"
)

// Gate lets at most one request of a session use a server chunk at a
// time, across all paths of the session, and queues the others in arrival
// order.
//
// One client never sends two requests for a chunk at once on one path: it
// reuses a chunk only after the answer arrived. Across paths it may. When a
// path fails, the client resends the path's requests on another path with
// the same chunk (permit), and then reuses the chunk, while the server may
// still run the stale request of the failed path: a stale write would then
// store whatever the chunk holds by the time it runs, a stale read would
// overwrite the data of the next write placed in the chunk. The gate makes
// the resent request, and so every later one, wait until the stale request
// has finished with the chunk.
//
// Enter and Leave take one atomic operation each when nothing waits, so the
// gate costs the IO path no lock. T is the server's request type.
type Gate[T any] struct {
	chunks []gatedChunk[T]
}

// Chunk states.
const (
	chunkFree int32 = iota
	chunkHeld
	chunkHeldWaiters // held, and waiters are queued: Leave takes mu
)

type gatedChunk[T any] struct {
	state   atomic.Int32
	mu      sync.Mutex // guards waiters; state moves to or from chunkHeldWaiters only under it
	waiters []T
}

// New returns a gate for chunks 0..n-1.
func New[T any](n int) *Gate[T] {
	return &Gate[T]{chunks: make([]gatedChunk[T], n)}
}

// Enter asks for chunk id on behalf of request r. It returns true when the
// chunk was free and r now holds it. Otherwise r is queued behind the
// holder; a later Leave hands the chunk to r and returns it to be run.
func (g *Gate[T]) Enter(id int, r T) bool {
	c := &g.chunks[id]
	if c.state.CompareAndSwap(chunkFree, chunkHeld) {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch c.state.Load() {
		case chunkFree:
			if c.state.CompareAndSwap(chunkFree, chunkHeld) {
				return true
			}
		case chunkHeld:
			if !c.state.CompareAndSwap(chunkHeld, chunkHeldWaiters) {
				continue
			}
			fallthrough
		default:
			c.waiters = append(c.waiters, r)
			return false
		}
	}
}

// Leave releases chunk id, held by the caller's request. If a request
// waits for the chunk, Leave hands the chunk to it and returns it with
// true: the caller must run it.
func (g *Gate[T]) Leave(id int) (next T, ok bool) {
	c := &g.chunks[id]
	if c.state.CompareAndSwap(chunkHeld, chunkFree) {
		return next, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state.Load() != chunkHeldWaiters || len(c.waiters) == 0 {
		// Not held: a caller's bug; freeing is the safe answer.
		c.state.Store(chunkFree)
		return next, false
	}
	next = c.waiters[0]
	var zero T
	c.waiters[0] = zero
	c.waiters = c.waiters[1:]
	if len(c.waiters) == 0 {
		c.waiters = nil
		c.state.Store(chunkHeld)
	}
	return next, true
}

// Waiting returns the number of requests queued for chunk id.
func (g *Gate[T]) Waiting(id int) int {
	c := &g.chunks[id]
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
