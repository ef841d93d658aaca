package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// These tests drive the state machine with a transport of pure logic; the
// same behaviour is tested for real through each transport (rtrs/tcp on
// the host, rtrs/rdmatr in the lab).

// fakeTransport connects a path when its server is up (up[dst]) and
// records what the session layer tells it.
type fakeTransport struct {
	mu       sync.Mutex
	up       map[string]bool
	params   rtrs.Params
	starts   int
	connects map[string]int
	reqs     []rtrs.ConnReq
	fenced   map[int]uint64 // by path index
	live     map[int]*fakeConn
	// answerFences: the service loops answer fences (errno 0)
	answerFences bool
	// silent: the service loops never call Alive (heartbeats unanswered)
	silent bool
}

func newFake(params rtrs.Params, up ...string) *fakeTransport {
	t := &fakeTransport{up: map[string]bool{}, params: params, connects: map[string]int{}, fenced: map[int]uint64{}, live: map[int]*fakeConn{}, answerFences: true}
	for _, u := range up {
		t.up[u] = true
	}
	return t
}

func (t *fakeTransport) setUp(dst string, up bool) {
	t.mu.Lock()
	t.up[dst] = up
	t.mu.Unlock()
}

func (t *fakeTransport) CheckPath(a rtrs.PathAddr) error {
	if a.Dst == "" {
		return fmt.Errorf("no destination: %w", syscall.EINVAL)
	}
	return nil
}

func (t *fakeTransport) Connect(ctx context.Context, p *Path) (Conn, error) {
	if p.Addr().Dst == "hang" { // a path whose connects never end before their timeout
		<-ctx.Done()
		return nil, ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.connects[p.Addr().Dst]++
	t.reqs = append(t.reqs, p.ConnReq(0))
	if !t.up[p.Addr().Dst] {
		return nil, fmt.Errorf("connect %s: %w", p.Addr().Dst, syscall.ECONNREFUSED)
	}
	return &fakeConn{t: t, p: p, params: t.params}, nil
}

func (t *fakeTransport) Start(params rtrs.Params) error {
	t.mu.Lock()
	t.starts++
	t.mu.Unlock()
	return nil
}

func (t *fakeTransport) WakeQueues() {}

func (t *fakeTransport) Fenced(p *Path, gen uint64) {
	t.mu.Lock()
	t.fenced[p.Index()] = gen
	t.mu.Unlock()
}

func (t *fakeTransport) SetPolicy(rtrs.MPPolicy) {}

func (t *fakeTransport) conn(idx int) *fakeConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live[idx]
}

type fakeConn struct {
	t      *fakeTransport
	p      *Path
	params rtrs.Params
	gen    uint64
}

func (c *fakeConn) Params() rtrs.Params { return c.params }

func (c *fakeConn) Attach(gen uint64) error {
	c.gen = gen
	c.t.mu.Lock()
	c.t.live[c.p.Index()] = c
	c.t.mu.Unlock()
	return nil
}

func (c *fakeConn) Serve(p *Path) {
	for !p.Stopping() {
		if p.HeartbeatDue(time.Now()) {
			c.t.mu.Lock()
			silent := c.t.silent
			c.t.mu.Unlock()
			if !silent {
				p.HeartbeatAcked()
			}
		}
		if _, ok := p.NextFence(); ok {
			c.t.mu.Lock()
			answer := c.t.answerFences
			c.t.mu.Unlock()
			if answer {
				p.FenceAnswered(0)
			}
		}
		select {
		case <-p.Wakeups():
		case <-time.After(time.Until(p.NextHeartbeat())):
		}
	}
}

func (c *fakeConn) Close() {
	c.t.mu.Lock()
	if c.t.live[c.p.Index()] == c {
		delete(c.t.live, c.p.Index())
	}
	c.t.mu.Unlock()
}

func testConfig(dsts ...string) rtrs.ClientConfig {
	cfg := rtrs.ClientConfig{SessName: "fake", Queues: 1, MaxReconnectAttempts: -1,
		ReconnectDelay: 10 * time.Millisecond, HeartbeatInterval: 20 * time.Millisecond, MissedHeartbeats: 2, Timeout: time.Second}
	for _, d := range dsts {
		cfg.Paths = append(cfg.Paths, rtrs.PathAddr{Dst: d})
	}
	cfg, err := cfg.Checked()
	if err != nil {
		panic(err)
	}
	return cfg
}

var fenceParams = rtrs.Params{QueueDepth: 8, MaxIOSize: 4096, MaxHdrSize: 64, ChunkSize: 4160, Flags: rtrs.FlagFence}

func dial(t *testing.T, cfg rtrs.ClientConfig, tr Transport) (*Session, error) {
	t.Helper()
	s, err := New(cfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	err = s.Dial(context.Background())
	// Dial returns at the first path up: let the others make their first
	// attempt, so that each test starts from every path's outcome.
	for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		settled := 0
		for _, p := range s.API().Paths() {
			if p.State != "connecting" || p.LastError != "" {
				settled++
			}
		}
		if settled == len(cfg.Paths) {
			break
		}
	}
	return s, err
}

func waitState(t *testing.T, s *Session, idx int, want string) rtrs.ClientPathInfo {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p := s.API().Paths()[idx]
		if p.State == want {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("path %d: state %s (%s), want %s", idx, p.State, p.LastError, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestDialReturnsAtFirstPathAndNeedsOne(t *testing.T) {
	tr := newFake(fenceParams, "a")
	s, err := dial(t, testConfig("a", "b"), tr)
	if err != nil {
		t.Fatal(err)
	}
	if ps := s.API().Paths(); ps[0].State != "connected" || ps[1].State == "connected" {
		t.Errorf("after Dial: %+v; want path 0 connected, path 1 not", ps)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(s.API().Paths()[1].LastError, "refused"); {
		if time.Now().After(deadline) {
			t.Fatalf("path 1: %+v; want its reason", s.API().Paths()[1])
		}
		time.Sleep(time.Millisecond)
	}
	if s.Params() != fenceParams || tr.starts != 1 {
		t.Errorf("params %+v, %d starts; want the server's, one start", s.Params(), tr.starts)
	}
	tr.setUp("b", true)
	waitState(t, s, 1, "connected")
	// Both paths are DialClient's: both may create the session.
	for _, r := range tr.reqs {
		if !r.FirstConn || !r.Fence || r.PathsUUID != s.PathsUUID() {
			t.Errorf("conn req %+v: want first_conn, fence, the session's uuid", r)
		}
	}

	// A path whose connect hangs does not hold up the session.
	hs, err := New(testConfig("hang", "a"), tr)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	t0 := time.Now()
	if err := hs.Dial(context.Background()); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el > testConfig("a").Timeout/2 {
		t.Errorf("Dial took %v with one path hanging; want it back at the first path up", el)
	}

	tr2 := newFake(fenceParams)
	if _, err := dial(t, testConfig("x", "y"), tr2); !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "path x") || !strings.Contains(err.Error(), "path y") {
		t.Errorf("no server: %v; want every path's reason", err)
	}
}

func TestReconnectAfterFailure(t *testing.T) {
	tr := newFake(fenceParams, "a")
	s, err := dial(t, testConfig("a"), tr)
	if err != nil {
		t.Fatal(err)
	}
	c1 := tr.conn(0)
	tr.setUp("a", false)
	c1.p.Failed(c1.gen, "test: connection failed")
	waitState(t, s, 0, "reconnecting")
	for deadline := time.Now().Add(5 * time.Second); s.API().Paths()[0].LastError == ""; {
		if time.Now().After(deadline) {
			t.Fatal("reconnecting without a reason")
		}
		time.Sleep(time.Millisecond)
	}
	tr.setUp("a", true)
	waitState(t, s, 0, "connected")
	c2 := tr.conn(0)
	if c2 == nil || c2.gen != c1.gen+1 {
		t.Fatalf("after the reconnect: conn %+v, want gen %d", c2, c1.gen+1)
	}
	// A late report for the old connect does not fail the new one.
	c1.p.Failed(c1.gen, "test: late")
	time.Sleep(50 * time.Millisecond)
	if st := s.API().Paths()[0].State; st != "connected" || tr.conn(0) != c2 {
		t.Errorf("after a stale failure report: %s", st)
	}
	got := string(s.API().Paths()[0].Stats.AppendReconnects(nil))
	var ok, failed int
	if _, err := fmt.Sscan(got, &ok, &failed); err != nil || ok != 1 || failed < 1 {
		t.Errorf("stats/reconnects %q: want 1 success and the failed attempts", got)
	}
	// The reconnect fenced the old connect: its requests may go again.
	tr.mu.Lock()
	fenced := tr.fenced[0]
	tr.mu.Unlock()
	if fenced < c1.gen {
		t.Errorf("fenced gen %d after reconnect, want ≥ %d", fenced, c1.gen)
	}
}

func TestMaxReconnectAttemptsAndCommands(t *testing.T) {
	tr := newFake(fenceParams, "a", "b")
	cfg := testConfig("a", "b")
	s, err := dial(t, cfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	api := s.API()
	if err := api.SetMaxReconnectAttempts(2); err != nil {
		t.Fatal(err)
	}
	if err := api.SetMaxReconnectAttempts(-2); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("max_reconnect_attempts -2: %v, want EINVAL", err)
	}
	tr.setUp("a", false)
	tr.mu.Lock()
	before := tr.connects["a"]
	tr.mu.Unlock()
	c := tr.conn(0)
	c.p.Failed(c.gen, "test")
	waitState(t, s, 0, "disconnected")
	tr.mu.Lock()
	tries := tr.connects["a"] - before
	tr.mu.Unlock()
	if tries != 2 {
		t.Errorf("%d attempts before giving up, want 2", tries)
	}
	if !s.AnyHope() {
		t.Error("no hope with path b connected")
	}
	tr.setUp("a", true)
	if err := api.ReconnectPath(0); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, 0, "connected")
	if err := api.DisconnectPath(0); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, 0, "disconnected")
	if err := api.RemovePath(0); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, 0, "removed")
	if err := api.ReconnectPath(0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("reconnect of a removed path: %v, want ENOENT", err)
	}
	if _, err := api.AddPath(rtrs.PathAddr{Dst: "b"}); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("adding a path the session has: %v, want EEXIST", err)
	}
	if _, err := api.AddPath(rtrs.PathAddr{}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("adding a path the transport refuses: %v, want EINVAL", err)
	}
	idx, err := api.AddPath(rtrs.PathAddr{Dst: "a"}) // the removed one's address
	if err != nil || idx != 2 {
		t.Fatalf("AddPath: %d, %v; want index 2", idx, err)
	}
	waitState(t, s, idx, "connected")
	tr.mu.Lock()
	last := tr.reqs[len(tr.reqs)-1]
	tr.mu.Unlock()
	if last.FirstConn {
		t.Error("a path added to a live session asked to create it (first_conn)")
	}
	api.DisconnectPath(1)
	api.DisconnectPath(2)
	waitState(t, s, 1, "disconnected")
	waitState(t, s, 2, "disconnected")
	if s.AnyHope() {
		t.Error("hope with every path disconnected")
	}
}

func TestOtherParamsOnReconnectDisconnect(t *testing.T) {
	tr := newFake(fenceParams, "a")
	s, err := dial(t, testConfig("a"), tr)
	if err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	tr.params.QueueDepth = 16
	tr.mu.Unlock()
	c := tr.conn(0)
	c.p.Failed(c.gen, "test")
	p := waitState(t, s, 0, "disconnected")
	if !strings.Contains(p.LastError, "other session parameters") {
		t.Errorf("last error %q, want the reason", p.LastError)
	}
}

func TestSilentPathFails(t *testing.T) {
	tr := newFake(fenceParams, "a")
	var logs strings.Builder
	var logMu sync.Mutex
	cfg := testConfig("a")
	cfg.Logf = func(f string, args ...any) {
		logMu.Lock()
		fmt.Fprintf(&logs, f+"\n", args...)
		logMu.Unlock()
	}
	s, err := dial(t, cfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	c1 := tr.conn(0)
	tr.mu.Lock()
	tr.silent = true
	tr.mu.Unlock()
	start := time.Now()
	for tr.conn(0) == c1 {
		if time.Since(start) > 5*time.Second {
			t.Fatal("a silent path was not failed")
		}
		time.Sleep(time.Millisecond)
	}
	// More than MissedHeartbeats (2) intervals of 20 ms.
	if el := time.Since(start); el < 2*cfg.HeartbeatInterval {
		t.Errorf("failed after %v, before %d intervals of silence", el, cfg.MissedHeartbeats)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "heartbeat intervals") {
		t.Errorf("log %q does not say why", logs.String())
	}
	_ = s
}

func TestFenceThroughAnotherPath(t *testing.T) {
	tr := newFake(fenceParams, "a", "b")
	s, err := dial(t, testConfig("a", "b"), tr)
	if err != nil {
		t.Fatal(err)
	}
	tr.setUp("a", false) // a stays down: only b can fence it
	c := tr.conn(0)
	c.p.Failed(c.gen, "test")
	deadline := time.Now().Add(5 * time.Second)
	for {
		tr.mu.Lock()
		f := tr.fenced[0]
		tr.mu.Unlock()
		if f >= c.gen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("path 0's connect %d not fenced through path 1 (fenced %d)", c.gen, f)
		}
		time.Sleep(time.Millisecond)
	}
	if s.API().Paths()[0].State == "connected" {
		t.Error("path 0 connected with its server down")
	}
}

func TestFenceRefusedOrUnansweredRetries(t *testing.T) {
	tr := newFake(fenceParams, "a", "b")
	tr.answerFences = false
	cfg := testConfig("a", "b")
	s, err := dial(t, cfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	tr.setUp("a", false)
	c := tr.conn(0)
	c.p.Failed(c.gen, "test")
	time.Sleep(10 * cfg.HeartbeatInterval)
	tr.mu.Lock()
	f := tr.fenced[0]
	tr.mu.Unlock()
	if f >= c.gen {
		t.Fatal("fenced though no fence was answered")
	}
	// A fence sent and not answered resets the path that carries it
	// (an answer that came late could be taken for the next fence's).
	if b := tr.conn(1); b == nil || b.gen == 1 {
		t.Errorf("path 1 not reset after an unanswered fence: %+v", b)
	}
	// Once the server answers, the path is fenced.
	tr.mu.Lock()
	tr.answerFences = true
	tr.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tr.mu.Lock()
		f = tr.fenced[0]
		tr.mu.Unlock()
		if f >= c.gen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not fenced once the server answers")
		}
		time.Sleep(time.Millisecond)
	}
	_ = s
}

func TestCloseEndsEveryPath(t *testing.T) {
	tr := newFake(fenceParams, "a")
	s, err := dial(t, testConfig("a", "b"), tr)
	if err != nil {
		t.Fatal(err)
	}
	// A path whose connect hangs: Close ends the attempt, not its timeout.
	if _, err := s.API().AddPath(rtrs.PathAddr{Dst: "hang"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	t0 := time.Now()
	done := make(chan bool)
	go func() { done <- s.Close() }()
	select {
	case closed := <-done:
		if !closed {
			t.Error("the first Close reported the session closed already")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if el := time.Since(t0); el > testConfig("a").Timeout/2 {
		t.Errorf("Close took %v with a connect under way; want it ended at once", el)
	}
	if s.Close() {
		t.Error("a second Close closed it again")
	}
	if tr.conn(0) != nil {
		t.Error("a connection left open after Close")
	}
	if _, err := s.API().AddPath(rtrs.PathAddr{Dst: "c"}); err == nil {
		t.Error("AddPath after Close succeeded")
	}
	if s.AnyHope() {
		t.Error("hope after Close")
	}
}
