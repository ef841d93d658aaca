package rtrs

import (
	"math/bits"
	"sync/atomic"
)

// Permits hands out a session's chunk indexes (buffer ids): a request holds
// one from submission to completion, so at most QueueDepth requests are in
// flight per session, whatever the number of paths and CPUs. This is the
// credit scheme of RTRS: a client without a permit waits, and a slow server
// pushes back instead of having requests buffered without bound.
//
// The ids are shared by all paths of a session, which is what lets a request
// fail over to another path with the same id. Get and Put are lock free.
type Permits struct {
	words []atomic.Uint64
	n     int
	used  atomic.Int64
}

// NewPermits returns a pool of n permits, ids 0..n-1.
func NewPermits(n int) *Permits {
	p := &Permits{words: make([]atomic.Uint64, (n+63)/64), n: n}
	if r := n % 64; r != 0 {
		// Bits past n in the last word are permanently taken.
		p.words[len(p.words)-1].Store(^uint64(0) << r)
	}
	return p
}

// Len returns the number of permits.
func (p *Permits) Len() int { return p.n }

// InUse returns the number of permits held.
func (p *Permits) InUse() int { return int(p.used.Load()) }

// Get takes a free permit, starting the search at word hint (callers on
// different CPUs pass different hints to avoid contending on one word). It
// returns false when all permits are held.
func (p *Permits) Get(hint int) (int, bool) {
	nw := len(p.words)
	for i := 0; i < nw; i++ {
		w := (hint + i) % nw
		for {
			old := p.words[w].Load()
			if old == ^uint64(0) {
				break
			}
			bit := bits.TrailingZeros64(^old)
			if p.words[w].CompareAndSwap(old, old|1<<bit) {
				p.used.Add(1)
				return w*64 + bit, true
			}
		}
	}
	return 0, false
}

// Put returns permit id.
func (p *Permits) Put(id int) {
	p.words[id/64].And(^(uint64(1) << (id % 64)))
	p.used.Add(-1)
}
