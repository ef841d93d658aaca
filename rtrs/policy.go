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
