package clientd

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rnbd"
)

// gatedDial is a Dial that waits for its gate before dialling for real
// (or failing with err), and reports each call on started.
type gatedDial struct {
	gate    chan struct{}
	started chan string
	err     error
}

func newGatedDial() *gatedDial {
	return &gatedDial{gate: make(chan struct{}), started: make(chan string, 8)}
}

func (g *gatedDial) dial(ctx context.Context, spec *MapSpec, queues, devices int) (*rnbd.Client, error) {
	g.started <- spec.SessName
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.err != nil {
		return nil, g.err
	}
	return Dial(ctx, spec, queues, devices)
}

func (g *gatedDial) waitStarted(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-g.started:
		if got != want {
			t.Fatalf("dial of session %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no dial of session %q", want)
	}
}

type mapResult struct {
	d   *Device
	err error
}

func goMap(r *Registry, rec Record) chan mapResult {
	ch := make(chan mapResult, 1)
	go func() {
		d, err := r.Map(context.Background(), &rec, 0)
		ch <- mapResult{d, err}
	}()
	return ch
}

// within fails the test unless fn returns before the deadline: the
// registry's lock is not held by a dial in progress.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatalf("%s waited for a dial in progress", what)
	}
}

func spec(sess, dev string) MapSpec {
	return MapSpec{SessName: sess, DevicePath: dev, AccessMode: "rw", Paths: []MapPath{{Dst: "127.0.0.1", Port: 1}}}
}

// A session being dialled holds up nothing but the maps through it; two
// maps of one device at once are refused; a dial that fails fails every
// map that waited for it and leaves no session behind.
func TestRegistryDialHoldsNoLock(t *testing.T) {
	g := newGatedDial()
	g.err = errors.New("server unreachable")
	r := NewRegistry(nil, Records{Dir: filepath.Join(t.TempDir(), "rnbd")})
	r.Dial = g.dial
	first := goMap(r, Record{Spec: spec("s1", "a.img")})
	g.waitStarted(t, "s1")

	within(t, "List", func() { r.List() })
	within(t, "Sessions", func() {
		if n := len(r.Sessions()); n != 0 {
			t.Errorf("%d sessions while the only one is being dialled", n)
		}
	})
	within(t, "Idle", func() {
		if r.Idle() {
			t.Error("idle with a map under way")
		}
	})
	within(t, "Unmap", func() {
		if _, err := r.Unmap(context.Background(), 5, false); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("unmap of nothing: %v, want ENOENT", err)
		}
	})
	within(t, "the same map again", func() {
		rec := Record{Spec: spec("s1", "a.img")}
		if _, err := r.Map(context.Background(), &rec, 0); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("second map of a device being mapped: %v, want EEXIST", err)
		}
	})
	other := goMap(r, Record{Spec: spec("s2", "b.img")})
	g.waitStarted(t, "s2") // another session dials at once, not after s1
	second := goMap(r, Record{Spec: spec("s1", "c.img")})
	select {
	case res := <-second:
		t.Fatalf("a map through a session being dialled did not wait for the dial: %v", res.err)
	case <-time.After(100 * time.Millisecond):
	}

	close(g.gate)
	for name, ch := range map[string]chan mapResult{"first": first, "second": second, "other": other} {
		res := <-ch
		if res.err == nil || res.err.Error() != "server unreachable" {
			t.Errorf("%s map: %v, want the dial's error", name, res.err)
		}
	}
	if n := len(r.Sessions()); n != 0 || !r.Idle() {
		t.Errorf("after failed dials: %d sessions, idle %v; want none and idle", n, r.Idle())
	}
	select {
	case name := <-g.started:
		t.Errorf("session %s dialled twice", name)
	default:
	}
}

// A real session over loopback: a map that waited for the dial and asks
// for other queues is refused (EINVAL), a map of a device the server does
// not have fails, and the session it opened is closed and forgotten.
func TestRegistryRealSession(t *testing.T) {
	g := newGatedDial()
	r := NewRegistry(nil, Records{Dir: filepath.Join(t.TempDir(), "rnbd")})
	r.Dial = g.dial
	var opened []string
	r.OnSession = func(s *Session) { opened = append(opened, s.Spec.SessName) }
	sp := loopbackSpec(t, "reg", "missing.img")
	first := goMap(r, Record{Spec: *sp, Queues: 2})
	g.waitStarted(t, "reg")
	sp2 := *sp
	sp2.DevicePath = "other.img"
	mismatched := goMap(r, Record{Spec: sp2, Queues: 3})
	time.Sleep(50 * time.Millisecond) // let it wait for the dial
	close(g.gate)
	if res := <-mismatched; !errors.Is(res.err, syscall.EINVAL) {
		t.Errorf("map asking for 3 queues of a 2-queue session: %v, want EINVAL", res.err)
	}
	if res := <-first; res.err == nil || !errors.Is(res.err, syscall.ENOENT) {
		t.Errorf("map of a device the server does not have: %v, want ENOENT", res.err)
	}
	if len(opened) != 1 || opened[0] != "reg" {
		t.Errorf("sessions dialled: %v, want [reg]", opened)
	}
	if n := len(r.Sessions()); n != 0 || !r.Idle() {
		t.Errorf("after the failed maps: %d sessions, idle %v; want none and idle", n, r.Idle())
	}
	if _, err := r.Session("reg"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Session of a closed session: %v, want ENOENT", err)
	}
}
