// Package sessiontest holds the client session tests that every RTRS
// transport runs, through the same assertions: rtrs/tcp on the host,
// rtrs/rdmatr in the lab. A transport supplies an Env: a memory-backed
// server it can stop and start again, and a client dialled with a given
// configuration. The tests know nothing of sockets or verbs.
package sessiontest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// Env is a transport's side of the tests.
type Env interface {
	// NewServer starts a server over memory of at least MemSize bytes
	// that serves a request whose user message is the le64 byte offset
	// of its data (a write stores the data there, a read returns it).
	// It is stopped when the test ends.
	NewServer(t *testing.T) Server
	// Dial opens a client session with cfg and runs its queues, each on
	// a thread of its own, until the test ends.
	Dial(t *testing.T, cfg rtrs.ClientConfig) (Client, error)
}

// MemSize is the least memory of a test server.
const MemSize = 4 << 20

// Server is a test server.
type Server interface {
	// Paths returns two paths to the server, each with its own address.
	Paths() []rtrs.PathAddr
	// Stop closes the server: its connections fail and new ones are
	// refused. Start serves again on the same addresses, memory kept.
	Stop()
	Start()
	// FailPath makes the connections of path i (Paths()[i]) fail now, on
	// the server's side; new ones are accepted.
	FailPath(i int)
}

// Client is a client session of either transport.
type Client interface {
	Paths() []rtrs.ClientPathInfo
	AddPath(a rtrs.PathAddr) (int, error)
	RemovePath(idx int) error
	DisconnectPath(idx int) error
	ReconnectPath(idx int) error
	SetMaxReconnectAttempts(n int) error
	MaxReconnectAttempts() int
	Queues() int
	Queue(i int) rtrs.Queue
	// Memory returns request memory, Queues × 64 KiB at least (over RDMA
	// inside the registered region).
	Memory() []byte
	Close() error
}

// Run runs every test of the suite as a subtest.
func Run(t *testing.T, env Env) {
	t.Run("PathManagement", func(t *testing.T) { testPathManagement(t, env) })
	t.Run("MaxReconnectAttempts", func(t *testing.T) { testMaxReconnectAttempts(t, env) })
	t.Run("ServerRestart", func(t *testing.T) { testServerRestart(t, env) })
	t.Run("FailoverWhenPathFails", func(t *testing.T) { testFailover(t, env) })
}

// Config returns the suite's client configuration over paths: fast
// timers, two queues.
func Config(paths ...rtrs.PathAddr) rtrs.ClientConfig {
	return rtrs.ClientConfig{SessName: "sessiontest", Paths: paths, Queues: 2, Policy: rtrs.RoundRobin,
		MaxReconnectAttempts: -1, ReconnectDelay: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		MissedHeartbeats: 5, Timeout: 5 * time.Second}
}

func dial(t *testing.T, env Env, cfg rtrs.ClientConfig) Client {
	t.Helper()
	c, err := env.Dial(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitState(t *testing.T, c Client, idx int, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps := c.Paths()
		if idx < len(ps) && ps[idx].State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("path %d: %+v, want state %s", idx, ps, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// carried returns how many requests path idx has carried.
func carried(c Client, idx int) uint64 {
	s := c.Paths()[idx].Stats.Snapshot()
	return s.Read.Count + s.Write.Count
}

// verify writes fresh data through every queue, reads it back and
// compares, rounds times per slot, and fails the test on any error.
func verify(t *testing.T, c Client, rounds int) {
	t.Helper()
	waitVerified(t, c, startVerifiers(c, 4, rounds))
}

// startVerifiers starts a Verifier of slots slots (of 4 KiB) on every
// queue.
func startVerifiers(c Client, slots, rounds int) []*Verifier {
	var vs []*Verifier
	for i := 0; i < c.Queues(); i++ {
		v := NewVerifier(c.Queue(i), c.Memory()[i*64<<10:(i+1)*64<<10], i*64<<10, slots, 4096, rounds)
		vs = append(vs, v)
		c.Queue(i).Do(v.Start)
	}
	return vs
}

func waitVerified(t *testing.T, c Client, vs []*Verifier) {
	t.Helper()
	for _, v := range vs {
		v.Wait(t, 60*time.Second, func() string { return fmt.Sprintf("; paths %+v", c.Paths()) })
	}
}

// When a path's connections fail under I/O, every request completes, data
// checked (those in flight on it fail over to the other path); the other
// path stays up, and the failed one comes back and carries requests again.
func testFailover(t *testing.T, env Env) {
	srv := env.NewServer(t)
	pa := srv.Paths()
	c := dial(t, env, Config(pa[0], pa[1]))
	waitState(t, c, 1, "connected")
	vs := startVerifiers(c, 16, 300)
	for deadline := time.Now().Add(30 * time.Second); vs[0].Ops() < 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no I/O before the failure: %d requests done; paths %+v", vs[0].Ops(), c.Paths())
		}
	}
	srv.FailPath(0)
	waitVerified(t, c, vs)
	// Whether requests were in flight on path 0 at that moment is up to
	// timing (rtrs/tcp's TestSessionFailoverWhenPathDies holds them in a
	// proxy to be sure); what must hold is that none was lost or damaged.
	p := c.Paths()
	t.Logf("failovers counted on path 0: %d", p[0].Stats.Snapshot().Failovers)
	if p[1].State != "connected" {
		t.Errorf("path 1 after path 0 failed: %+v", p[1])
	}
	waitState(t, c, 0, "connected")
	before := carried(c, 0)
	verify(t, c, 20)
	if carried(c, 0) == before {
		t.Error("path 0 carries no request after it came back")
	}
}

// Paths are added, disconnected, reconnected and removed at run time, and
// I/O keeps completing, verified, through whatever is left.
func testPathManagement(t *testing.T, env Env) {
	srv := env.NewServer(t)
	pa := srv.Paths()
	c := dial(t, env, Config(pa[0]))
	verify(t, c, 10)

	idx, err := c.AddPath(pa[1])
	if err != nil || idx != 1 {
		t.Fatalf("AddPath = %d, %v; want 1", idx, err)
	}
	if _, err := c.AddPath(pa[1]); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("adding the same path twice: %v, want EEXIST", err)
	}
	waitState(t, c, 1, "connected")
	before := carried(c, 1)
	verify(t, c, 10)
	if carried(c, 1) == before {
		t.Error("the added path carries no request")
	}

	if err := c.DisconnectPath(0); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, 0, "disconnected")
	before = carried(c, 0)
	verify(t, c, 10)
	time.Sleep(300 * time.Millisecond) // several reconnect delays: it must stay down
	if s := c.Paths()[0].State; s != "disconnected" {
		t.Errorf("a disconnected path came back by itself: %s", s)
	}
	if carried(c, 0) != before {
		t.Error("requests went over the disconnected path")
	}

	if err := c.ReconnectPath(0); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, 0, "connected")
	verify(t, c, 10)

	if err := c.RemovePath(1); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, 1, "removed")
	before = carried(c, 1)
	verify(t, c, 10)
	if carried(c, 1) != before {
		t.Error("requests went over the removed path")
	}
	for what, err := range map[string]error{
		"RemovePath of a removed path":    c.RemovePath(1),
		"ReconnectPath of a removed path": c.ReconnectPath(1),
		"DisconnectPath of no path":       c.DisconnectPath(7),
	} {
		if !errors.Is(err, syscall.ENOENT) {
			t.Errorf("%s: %v, want ENOENT", what, err)
		}
	}
	if p := c.Paths()[0]; p.LastError != "" {
		t.Errorf("connected path 0 has a last error %q", p.LastError)
	}
}

// A path gives up after max_reconnect_attempts failed attempts in a row,
// as set at run time, and requests then fail with -ENOTCONN instead of
// waiting forever; ReconnectPath brings it back.
func testMaxReconnectAttempts(t *testing.T, env Env) {
	srv := env.NewServer(t)
	cfg := Config(srv.Paths()[0])
	cfg.Queues = 1
	c := dial(t, env, cfg)
	for _, bad := range []int{-2, 10000} {
		if err := c.SetMaxReconnectAttempts(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("SetMaxReconnectAttempts(%d) = %v, want EINVAL", bad, err)
		}
	}
	if err := c.SetMaxReconnectAttempts(3); err != nil {
		t.Fatal(err)
	}
	if n := c.MaxReconnectAttempts(); n != 3 {
		t.Fatalf("MaxReconnectAttempts() = %d after setting 3", n)
	}
	verify(t, c, 2)
	srv.Stop()
	// With -1 (the configuration) it would reconnect forever.
	waitState(t, c, 0, "disconnected")
	p := c.Paths()[0]
	if got := string(p.Stats.AppendReconnects(nil)); got != "0 3\n" {
		t.Errorf("stats/reconnects = %q, want \"0 3\\n\" (the first connect, then 3 failed attempts)", got)
	}
	if p.LastError == "" {
		t.Error("a path that gave up does not say why")
	}
	got := make(chan int, 1)
	r := &rtrs.Request{Write: true, Data: c.Memory()[:512], Usr: make([]byte, 8), Done: func(_ *rtrs.Request, e int) { got <- e }}
	q := c.Queue(0)
	q.Do(func() {
		if err := q.Submit(r); err != nil {
			got <- -int(syscall.EINVAL)
		}
	})
	select {
	case e := <-got:
		if e != -int(syscall.ENOTCONN) {
			t.Errorf("request on a session with no path left: errno %d, want -ENOTCONN", e)
		}
	case <-time.After(10 * time.Second):
		t.Error("request on a session with no path left never completed")
	}
	srv.Start()
	if err := c.ReconnectPath(0); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, 0, "connected")
	verify(t, c, 2)
}

// A session reconnects to a restarted server, and requests submitted
// while it was down complete, data checked.
func testServerRestart(t *testing.T, env Env) {
	srv := env.NewServer(t)
	c := dial(t, env, Config(srv.Paths()[0]))
	verify(t, c, 4)
	srv.Stop()
	waitState(t, c, 0, "reconnecting")
	done := make(chan struct{})
	go func() {
		defer close(done)
		verify(t, c, 4)
	}()
	time.Sleep(300 * time.Millisecond)
	srv.Start()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("I/O submitted while the server was down did not complete after it came back")
	}
	p := c.Paths()[0]
	if got := string(p.Stats.AppendReconnects(nil)); p.State != "connected" || len(got) < 2 || got[:2] != "1 " {
		t.Errorf("after restart: state %s, stats/reconnects %q; want connected, 1 success", p.State, got)
	}
}

// Verifier keeps slots requests in flight on one queue: each slot writes
// fresh random data to its own place (user message: the le64 offset
// base + slot×size), reads it back and compares, rounds times. It runs on
// the queue's thread (Start).
type Verifier struct {
	q       rtrs.Queue
	base    int
	size    int
	reqs    []rtrs.Request
	want    [][]byte
	usr     [][8]byte
	left    []int
	rng     *rand.Rand
	running int
	errs    []string
	done    chan struct{}
	ops     atomic.Int64
}

// NewVerifier makes a verifier on q whose request data lies in mem
// (slots × size bytes at least).
func NewVerifier(q rtrs.Queue, mem []byte, base, slots, size, rounds int) *Verifier {
	v := &Verifier{q: q, base: base, size: size, reqs: make([]rtrs.Request, slots), want: make([][]byte, slots),
		usr: make([][8]byte, slots), left: make([]int, slots), rng: rand.New(rand.NewSource(time.Now().UnixNano())), done: make(chan struct{})}
	for i := range v.reqs {
		v.want[i] = make([]byte, size)
		v.reqs[i].Data = mem[i*size : (i+1)*size : (i+1)*size]
		v.reqs[i].Tag = uint64(i)
		v.reqs[i].Done = v.onDone
		v.left[i] = rounds
	}
	return v
}

// Start submits every slot's first write; call it on the queue's thread
// (q.Do(v.Start)).
func (v *Verifier) Start() {
	v.running = len(v.reqs)
	for i := range v.reqs {
		v.write(i)
	}
}

// Ops returns how many requests have completed.
func (v *Verifier) Ops() int64 { return v.ops.Load() }

// Wait waits until every slot is done, at most d, and fails the test on
// any error; diag adds to the message of a verifier not done in time.
func (v *Verifier) Wait(t testing.TB, d time.Duration, diag ...func() string) {
	t.Helper()
	select {
	case <-v.done:
	case <-time.After(d):
		more := ""
		for _, f := range diag {
			more += f()
		}
		t.Fatalf("I/O not done after %v (%d requests completed) %s", d, v.ops.Load(), more)
	}
	if len(v.errs) > 0 {
		t.Fatalf("%d I/O errors, first: %s", len(v.errs), v.errs[0])
	}
}

func (v *Verifier) write(i int) {
	r := &v.reqs[i]
	v.rng.Read(v.want[i])
	copy(r.Data, v.want[i])
	binary.LittleEndian.PutUint64(v.usr[i][:], uint64(v.base+i*v.size))
	r.Write, r.Usr = true, v.usr[i][:]
	if err := v.q.Submit(r); err != nil {
		v.errs = append(v.errs, fmt.Sprintf("submit: %v", err))
		v.end()
	}
}

func (v *Verifier) onDone(r *rtrs.Request, errno int) {
	i := int(r.Tag)
	v.ops.Add(1)
	if errno != 0 {
		v.errs = append(v.errs, fmt.Sprintf("slot %d: errno %d", i, errno))
		v.end()
		return
	}
	if r.Write {
		clear(r.Data)
		r.Write = false
		if err := v.q.Submit(r); err != nil {
			v.errs = append(v.errs, fmt.Sprintf("submit: %v", err))
			v.end()
		}
		return
	}
	if !bytes.Equal(r.Data, v.want[i]) {
		v.errs = append(v.errs, fmt.Sprintf("slot %d: read back differs from what was written", i))
	}
	if v.left[i]--; v.left[i] == 0 {
		v.end()
		return
	}
	v.write(i)
}

func (v *Verifier) end() {
	if v.running--; v.running == 0 {
		close(v.done)
	}
}
