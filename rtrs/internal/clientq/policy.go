package clientq

import "github.com/urnbd/urnbd/rtrs"

// PathLoad is what a policy needs to know of a path.
type PathLoad interface {
	// Usable reports whether the path is connected and takes requests.
	Usable() bool
	// Inflight returns the requests in flight on the path.
	Inflight() int64
	// Latency returns the path's last heartbeat round trip in ns.
	Latency() int64
}

// Select returns the index of the path that policy p picks among paths, or
// -1 if none is usable (a zero P is not). cursor is the caller's round-robin position (one per
// CPU) and is advanced. skip, if not negative, is a path not to pick (the
// one a request is failing over from) unless it is the only usable one.
func Select[P interface {
	comparable
	PathLoad
}](p rtrs.MPPolicy, paths []P, cursor *int, skip int) int {
	best := -1
	n := len(paths)
	for i := 0; i < n; i++ {
		idx := i
		if p == rtrs.RoundRobin {
			idx = (*cursor + i) % n
		}
		if idx == skip || !usable(paths[idx]) {
			continue
		}
		if best < 0 {
			best = idx
			if p == rtrs.RoundRobin {
				break
			}
			continue
		}
		switch p {
		case rtrs.MinInflight:
			if paths[idx].Inflight() < paths[best].Inflight() {
				best = idx
			}
		case rtrs.MinLatency:
			if paths[idx].Latency() < paths[best].Latency() {
				best = idx
			}
		}
	}
	if best < 0 && skip >= 0 && skip < n && usable(paths[skip]) {
		best = skip
	}
	if p == rtrs.RoundRobin && best >= 0 {
		*cursor = best + 1
	}
	return best
}

func usable[P interface {
	comparable
	PathLoad
}](p P) bool {
	var zero P
	return p != zero && p.Usable()
}
