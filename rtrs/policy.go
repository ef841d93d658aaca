package rtrs

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// MPPolicy is a client session's multipath policy: which path a request
// takes. The values are those of the kernel's mpath_policy sysfs file.
type MPPolicy int

const (
	// RoundRobin spreads requests over the usable paths in turn, with one
	// cursor per CPU.
	RoundRobin MPPolicy = 0
	// MinInflight picks the usable path with the fewest requests in
	// flight (the kernel's default).
	MinInflight MPPolicy = 1
	// MinLatency picks the usable path with the lowest heartbeat round
	// trip time.
	MinLatency MPPolicy = 2
)

// Name returns "round-robin", "min-inflight" or "min-latency".
func (p MPPolicy) Name() string {
	switch p {
	case RoundRobin:
		return "round-robin"
	case MinInflight:
		return "min-inflight"
	case MinLatency:
		return "min-latency"
	}
	return "policy(" + strconv.Itoa(int(p)) + ")"
}

// String returns the policy as the kernel's mpath_policy file reads, e.g.
// "min-inflight (MI: 1)".
func (p MPPolicy) String() string {
	switch p {
	case RoundRobin:
		return "round-robin (RR: 0)"
	case MinInflight:
		return "min-inflight (MI: 1)"
	case MinLatency:
		return "min-latency (ML: 2)"
	}
	return p.Name()
}

// ParseMPPolicy parses what the kernel's mpath_policy file accepts: "0",
// "1", "2"; text starting with "round-robin", "min-inflight" or
// "min-latency" (any case); or exactly "rr", "mi", "ml". Anything else
// wraps EINVAL.
func ParseMPPolicy(s string) (MPPolicy, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "0", "rr":
		return RoundRobin, nil
	case "1", "mi":
		return MinInflight, nil
	case "2", "ml":
		return MinLatency, nil
	}
	for _, p := range []MPPolicy{RoundRobin, MinInflight, MinLatency} {
		if strings.HasPrefix(t, p.Name()) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("multipath policy %q: want round-robin, min-inflight, min-latency, rr, mi, ml or 0..2: %w", s, syscall.EINVAL)
}

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
// -1 if none is usable. cursor is the caller's round-robin position (one per
// CPU) and is advanced. skip, if not negative, is a path not to pick (the
// one a request is failing over from) unless it is the only usable one.
func Select[P PathLoad](p MPPolicy, paths []P, cursor *int, skip int) int {
	best := -1
	n := len(paths)
	for i := 0; i < n; i++ {
		idx := i
		if p == RoundRobin {
			idx = (*cursor + i) % n
		}
		if idx == skip || !paths[idx].Usable() {
			continue
		}
		if best < 0 {
			best = idx
			if p == RoundRobin {
				break
			}
			continue
		}
		switch p {
		case MinInflight:
			if paths[idx].Inflight() < paths[best].Inflight() {
				best = idx
			}
		case MinLatency:
			if paths[idx].Latency() < paths[best].Latency() {
				best = idx
			}
		}
	}
	if best < 0 && skip >= 0 && skip < n && paths[skip].Usable() {
		best = skip
	}
	if p == RoundRobin && best >= 0 {
		*cursor = best + 1
	}
	return best
}
