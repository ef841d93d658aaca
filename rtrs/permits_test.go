package rtrs

import (
	"errors"
	"sync"
	"syscall"
	"testing"
)

func TestPermitsExhaustAndReuse(t *testing.T) {
	for _, n := range []int{1, 5, 64, 65, 512} {
		p := NewPermits(n)
		seen := make(map[int]bool)
		for i := 0; i < n; i++ {
			id, ok := p.Get(i)
			if !ok || id < 0 || id >= n || seen[id] {
				t.Fatalf("n=%d: Get #%d = %d, %v (seen %v)", n, i, id, ok, seen[id])
			}
			seen[id] = true
		}
		if _, ok := p.Get(0); ok {
			t.Fatalf("n=%d: a permit beyond the depth was handed out", n)
		}
		if p.InUse() != n {
			t.Fatalf("in use %d, want %d", p.InUse(), n)
		}
		p.Put(n / 2)
		if id, ok := p.Get(3); !ok || id != n/2 {
			t.Fatalf("after Put(%d): Get = %d, %v", n/2, id, ok)
		}
	}
}

func TestPermitsConcurrent(t *testing.T) {
	p := NewPermits(100)
	var owners [100]int32
	var wg sync.WaitGroup
	var mu sync.Mutex
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				id, ok := p.Get(g)
				if !ok {
					continue
				}
				mu.Lock()
				if owners[id] != 0 {
					t.Errorf("permit %d handed out twice", id)
				}
				owners[id] = int32(g + 1)
				mu.Unlock()
				mu.Lock()
				owners[id] = 0
				mu.Unlock()
				p.Put(id)
			}
		}(g)
	}
	wg.Wait()
	if p.InUse() != 0 {
		t.Fatalf("in use %d after all returned", p.InUse())
	}
}

func TestPermitsAllocateNothing(t *testing.T) {
	p := NewPermits(128)
	if a := testing.AllocsPerRun(100, func() { id, _ := p.Get(1); p.Put(id) }); a != 0 {
		t.Fatalf("%v allocations per Get/Put", a)
	}
}

func TestParseMPPolicy(t *testing.T) {
	for in, want := range map[string]MPPolicy{
		"0": RoundRobin, "rr": RoundRobin, "round-robin": RoundRobin, "Round-Robin\n": RoundRobin, "round-robinx": RoundRobin,
		"1": MinInflight, "MI": MinInflight, "min-inflight": MinInflight,
		"2": MinLatency, "ml": MinLatency, "min-latency": MinLatency,
	} {
		got, err := ParseMPPolicy(in)
		if err != nil || got != want {
			t.Errorf("ParseMPPolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "3", "min", "m", "x", "round", "min-i", "-1"} {
		if _, err := ParseMPPolicy(in); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("ParseMPPolicy(%q) = %v, want EINVAL", in, err)
		}
	}
	if MinInflight.String() != "min-inflight (MI: 1)" {
		t.Errorf("String = %q", MinInflight.String())
	}
}
