package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs/internal/sessiontest"

	"github.com/urnbd/urnbd/rtrs"
)

// memBackend serves requests from memory; the user message is the 8-byte
// byte offset. It counts requests per server address and, while hold is
// set, keeps them until release.
type memBackend struct {
	mu       sync.Mutex
	mem      []byte
	perAddr  map[net.Addr]int // by server address (a pointer key: no allocation)
	held     []*ServerIO
	hold     bool
	inflight atomic.Int64
	peak     atomic.Int64
}

func newMemBackend(size int) *memBackend {
	return &memBackend{mem: make([]byte, size), perAddr: make(map[net.Addr]int)}
}

func (b *memBackend) HandleIO(io *ServerIO) {
	n := b.inflight.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	b.mu.Lock()
	b.perAddr[io.Local]++
	if b.hold {
		b.held = append(b.held, io)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.serve(io)
}

func (b *memBackend) serve(io *ServerIO) {
	off := int(binary.LittleEndian.Uint64(io.Usr))
	b.mu.Lock()
	if io.Write {
		copy(b.mem[off:], io.Data)
	} else {
		copy(io.Data, b.mem[off:])
	}
	b.mu.Unlock()
	b.inflight.Add(-1)
	io.Complete(0)
}

func (b *memBackend) release() {
	b.mu.Lock()
	held := b.held
	b.held, b.hold = nil, false
	b.mu.Unlock()
	for _, io := range held {
		b.serve(io)
	}
}

func (b *memBackend) count(addr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for a, k := range b.perAddr {
		if a.String() == addr {
			n += k
		}
	}
	return n
}

const sessQD = 64

func startIOServer(t *testing.T, h ServerHandler, addr string) (*Server, string) {
	t.Helper()
	srv, err := NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: sessQD, ChunkSize: 64 << 10, MaxHdrSize: 4096, HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 5}, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv, ln.Addr().String()
}

// addListener makes srv serve on one more loopback port.
func addListener(t *testing.T, srv *Server) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	return ln.Addr().String()
}

// proxy forwards a local port to a server; it can delay traffic or die.
type proxy struct {
	ln    net.Listener
	to    string
	delay atomic.Int64
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func startProxy(t *testing.T, to string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, to: to}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.dead {
				p.mu.Unlock()
				c.Close()
				s.Close()
				continue
			}
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := p.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

// cut closes every connection through the proxy; new ones are accepted.
func (p *proxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// kill closes the proxy and every connection through it: the path dies and
// cannot reconnect.
func (p *proxy) kill() {
	p.mu.Lock()
	p.dead = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

func dialTest(t *testing.T, policy rtrs.MPPolicy, queues int, dsts ...string) *Client {
	t.Helper()
	return dialTestConfig(t, testConfig(policy, queues, dsts...))
}

// testConfig is the client configuration of dialTest.
func testConfig(policy rtrs.MPPolicy, queues int, dsts ...string) ClientConfig {
	cfg := ClientConfig{SessName: "test", Queues: queues, Policy: policy, MaxReconnectAttempts: -1,
		ReconnectDelay: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 5,
		Timeout: 2 * time.Second}
	for _, d := range dsts {
		cfg.Paths = append(cfg.Paths, PathAddr{Dst: d})
	}
	return cfg
}

// dialTestConfig dials cfg and runs its queues (the admin queue too)
// until the test ends.
func dialTestConfig(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second+cfg.Timeout)
	defer cancel()
	c, err := DialClient(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// DialClient returns at the first path up: give the others a moment,
	// as the tests expect every reachable path connected.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		up := 0
		for _, p := range c.Paths() {
			if p.State == "connected" {
				up++
			}
		}
		if up == len(cfg.Paths) {
			break
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	queues := []*ClientQueue{}
	for i := 0; i < c.Queues(); i++ {
		queues = append(queues, c.Queue(i))
	}
	if a := c.Admin(); a != nil {
		queues = append(queues, a)
	}
	for _, q := range queues {
		wg.Add(1)
		go func(q *ClientQueue) {
			defer wg.Done()
			if err := q.Run(nil); err != nil {
				t.Error(err)
			}
		}(q)
	}
	go func() { wg.Wait(); close(done) }()
	t.Cleanup(func() {
		c.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("queues did not stop after Close")
		}
	})
	return c
}

// runVerifiers runs a verifier (sessiontest.Verifier) on every queue.
func runVerifiers(c *Client, slots, size, rounds int) []*sessiontest.Verifier {
	var vs []*sessiontest.Verifier
	for i := 0; i < c.Queues(); i++ {
		v := sessiontest.NewVerifier(c.Queue(i), make([]byte, slots*size), i*slots*size, slots, size, rounds)
		vs = append(vs, v)
		c.Queue(i).Do(v.Start)
	}
	return vs
}

func TestSessionReadWriteVerified(t *testing.T) {
	b := newMemBackend(16 << 20)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 2, addr)
	if p := c.Params(); p.QueueDepth != sessQD || p.MaxIOSize != 60<<10 {
		t.Fatalf("params %+v", p)
	}
	for _, size := range []int{512, 4096, 60 << 10} {
		for _, v := range runVerifiers(c, 8, size, 20) {
			v.Wait(t, 20*time.Second)
		}
	}
	if c.Permits().InUse() != 0 {
		t.Errorf("%d permits still held", c.Permits().InUse())
	}
}

// Large and small answers interleave on one connection: a large answer's
// payload is read straight into its buffer together with what follows it
// (the next answers' headers and small payloads), which must all arrive
// intact in the right requests.
func TestSessionMixedSizesVerified(t *testing.T) {
	b := newMemBackend(16 << 20)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 1, addr)
	q := c.Queue(0)
	var vs []*sessiontest.Verifier
	base := 0
	for _, size := range []int{48 << 10, 512, 60 << 10, 4096} {
		const slots = 8
		v := sessiontest.NewVerifier(q, make([]byte, slots*size), base, slots, size, 50)
		base += slots * size
		vs = append(vs, v)
	}
	for _, v := range vs {
		q.Do(v.Start)
	}
	for _, v := range vs {
		v.Wait(t, 30*time.Second)
	}
	// A frame misread would fail the connection and the requests would be
	// resent on a new one, passing the verifiers: there must be none.
	if got := string(c.Paths()[0].Stats.AppendReconnects(nil)); got != "0 0\n" {
		t.Errorf("reconnects %q, want none", got)
	}
	if c.Permits().InUse() != 0 {
		t.Errorf("%d permits still held", c.Permits().InUse())
	}
}

func TestSessionRejectsOversizedRequest(t *testing.T) {
	_, addr := startIOServer(t, newMemBackend(1<<20), "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 1, addr)
	got := make(chan error, 1)
	onQueue(c.Queue(0), func(q *ClientQueue) {
		r := &Request{Write: true, Data: make([]byte, 61<<10), Usr: make([]byte, 8), Done: func(*Request, int) {}}
		got <- q.Submit(r)
	})
	if err := <-got; err == nil {
		t.Fatal("a request larger than max_io_size was accepted")
	}
}

func TestSessionFailoverWhenPathDies(t *testing.T) {
	b := newMemBackend(16 << 20)
	srv, addrA := startIOServer(t, b, "127.0.0.1:0")
	addrB := addListener(t, srv)
	pa, pb := startProxy(t, addrA), startProxy(t, addrB)
	c := dialTest(t, rtrs.RoundRobin, 2, pa.addr(), pb.addr())
	vs := runVerifiers(c, 16, 48<<10, 200) // large: answers are received straight into their buffers
	// Let I/O run on both paths, then kill path A for good.
	deadline := time.Now().Add(10 * time.Second)
	for vs[0].Ops() < 200 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Hold path A's traffic in the proxy, so that requests are surely in
	// flight on A when it dies: they must fail over (and be counted).
	pa.delay.Store(int64(200 * time.Millisecond))
	// What the proxy read before the delay may still be on its way (the
	// answer to a request counted in flight: it completes, no failover);
	// after this pause, what is in flight on A is held.
	time.Sleep(50 * time.Millisecond)
	for c.Paths()[0].Stats.Inflight() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	pa.kill()
	onA, onB := b.count(addrA), b.count(addrB)
	if onA == 0 || onB == 0 {
		t.Fatalf("before the kill: %d requests on A, %d on B; want both used", onA, onB)
	}
	diag := func() string {
		out := fmt.Sprintf("server inflight %d, permits %d;", b.inflight.Load(), c.Permits().InUse())
		for _, p := range c.Paths() {
			out += fmt.Sprintf(" path %d %s rdma %q reconnects %q;", p.Index, p.State, p.Stats.AppendRdma(nil), p.Stats.AppendReconnects(nil))
		}
		for i := 0; i < c.Queues(); i++ {
			ch := make(chan string, 1)
			onQueue(c.Queue(i), func(q *ClientQueue) {
				st := ""
				for _, qc := range q.core.Slots {
					if qc != nil {
						st += fmt.Sprintf("[slot %d dead %v recv %v poll %v sendq %v]", qc.Slot, qc.Dead, qc.recvOn, qc.pollOn, !qc.sendq.empty())
					}
				}
				n, inflight, starved := q.core.Reqs.Counts()
				ch <- fmt.Sprintf(" q%d waiting %d inflight %d starved %v %s;", q.core.ID, n, inflight, starved, st)
			})
			select {
			case s := <-ch:
				out += s
			case <-time.After(time.Second):
				out += " (queue stuck)"
			}
		}
		return out
	}
	for _, v := range vs {
		v.Wait(t, 30*time.Second, diag)
	}
	if b.count(addrB) <= onB {
		t.Error("no request went over path B after A died")
	}
	t.Logf("requests on A %d (all before the kill, or failed over), on B %d then %d", b.count(addrA), onB, b.count(addrB))
	infos := c.Paths()
	if fo := infos[0].Stats.Snapshot(); fo.Failovers == 0 {
		t.Errorf("path A's stats count no failover: %s", infos[0].Stats.AppendRdma(nil))
	}
	if infos[0].State == "connected" {
		t.Errorf("path A still connected after its proxy died: %+v", infos[0])
	}
	if infos[1].State != "connected" {
		t.Errorf("path B: %+v", infos[1])
	}
	t.Logf("paths after the kill: %+v", infos)
}

// TestSessionHoldsIOAfterServerRestart restarts the server under a client
// that holds IO on reconnect (as RNBD does, to reopen its devices first):
// the link events come, requests wait while held though the path is up,
// the admin queue is not held, a Resume for an older reconnect changes
// nothing, and the requests complete, data checked, once resumed.
func TestSessionHoldsIOAfterServerRestart(t *testing.T) {
	b := newMemBackend(16 << 20)
	srv, addr := startIOServer(t, b, "127.0.0.1:0")
	events := make(chan rtrs.LinkEvent, 8)
	var gen atomic.Uint64
	cfg := testConfig(rtrs.MinInflight, 2, addr)
	cfg.AdminQueue, cfg.HoldIOOnReconnect = true, true
	t0 := time.Now()
	cfg.OnLinkEvent = func(ev rtrs.LinkEvent, g uint64) {
		t.Logf("%v: link %v, reconnect %d", time.Since(t0).Round(time.Millisecond), ev, g)
		gen.Store(g)
		select {
		case events <- ev:
		default: // the callback must not block
		}
	}
	c := dialTestConfig(t, cfg)
	for _, v := range runVerifiers(c, 4, 4096, 5) {
		v.Wait(t, 20*time.Second)
	}
	waitEvent := func(want rtrs.LinkEvent) {
		t.Helper()
		select {
		case ev := <-events:
			if ev != want {
				t.Fatalf("link event %v, want %v", ev, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no link event %v; paths %+v", want, c.Paths())
		}
	}
	srv.Close()
	waitEvent(rtrs.LinkDisconnected)
	startIOServer(t, b, addr)
	waitEvent(rtrs.LinkReconnected)
	if g := gen.Load(); g != 1 {
		t.Fatalf("reconnect %d, want 1", g)
	}

	vs := runVerifiers(c, 2, 4096, 3)
	admin := &oneShot{done: make(chan int, 1)}
	admin.r = Request{Write: true, Data: make([]byte, 4096), Usr: admin.usr[:], Done: admin.onDone}
	aq := c.Admin()
	aq.Do(func() { aq.Submit(&admin.r) })
	select {
	case errno := <-admin.done:
		if errno != 0 {
			t.Fatalf("admin request while held: errno %d", errno)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the admin queue is held too; paths %+v", c.Paths())
	}
	c.ResumeIO(0) // an older reconnect's
	time.Sleep(300 * time.Millisecond)
	for i, v := range vs {
		if n := v.Ops(); n != 0 {
			t.Fatalf("queue %d completed %d requests while IO was held", i, n)
		}
	}
	c.ResumeIO(1)
	for _, v := range vs {
		v.Wait(t, 20*time.Second, func() string {
			return fmt.Sprintf("gen %d, %d more events, paths %+v", gen.Load(), len(events), c.Paths())
		})
	}
}

func TestSessionPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy rtrs.MPPolicy
		slowA  bool
		check  func(a, b int) bool
		want   string
	}{
		{rtrs.RoundRobin, false, func(a, b int) bool { return a > 0 && b > 0 && abs(a-b) <= (a+b)/10 }, "both paths about equally"},
		{rtrs.MinInflight, true, func(a, b int) bool { return b > 2*a }, "most requests on the fast path B"},
		{rtrs.MinLatency, true, func(a, b int) bool { return a == 0 || b > 10*a }, "(nearly) all requests on the low-latency path B"},
	} {
		t.Run(tc.policy.Name(), func(t *testing.T) {
			b := newMemBackend(16 << 20)
			srv, addrA := startIOServer(t, b, "127.0.0.1:0")
			addrB := addListener(t, srv)
			pa, pb := startProxy(t, addrA), startProxy(t, addrB)
			if tc.slowA {
				pa.delay.Store(int64(2 * time.Millisecond))
			}
			c := dialTest(t, tc.policy, 1, pa.addr(), pb.addr())
			time.Sleep(300 * time.Millisecond) // a few heartbeats: latencies known
			v := sessiontest.NewVerifier(c.Queue(0), make([]byte, 8*4096), 0, 8, 4096, 50)
			c.Queue(0).Do(v.Start)
			v.Wait(t, 60*time.Second)
			a, bb := b.count(addrA), b.count(addrB)
			t.Logf("%s: path A %d requests, path B %d", tc.policy.Name(), a, bb)
			if !tc.check(a, bb) {
				t.Errorf("%s sent %d requests on A and %d on B; want %s", tc.policy.Name(), a, bb, tc.want)
			}
		})
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// With the server holding every request, only queue-depth requests reach
// it: the rest wait in the client, and Submit never blocks.
func TestSessionBackPressure(t *testing.T) {
	b := newMemBackend(16 << 20)
	b.hold = true
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 2, addr)
	vs := runVerifiers(c, 3*sessQD/2, 4096, 1) // 3×QD requests over two queues
	deadline := time.Now().Add(5 * time.Second)
	for b.inflight.Load() < sessQD && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if got := b.inflight.Load(); got != sessQD {
		t.Fatalf("server holds %d requests, want exactly the queue depth %d", got, sessQD)
	}
	if c.Permits().InUse() != sessQD {
		t.Fatalf("%d permits in use, want %d", c.Permits().InUse(), sessQD)
	}
	b.release()
	for _, v := range vs {
		v.Wait(t, 30*time.Second)
	}
	if p := b.peak.Load(); p > sessQD {
		t.Fatalf("server saw %d requests at once, more than the queue depth %d", p, sessQD)
	}
}

// oneShot issues one request at a time on a queue and signals each
// completion; for allocation counting from the test goroutine.
type oneShot struct {
	r    Request
	usr  [8]byte
	done chan int
}

func (o *oneShot) onDone(_ *Request, errno int) { o.done <- errno }

// The datapath of client and server (both in this process) allocates
// nothing per request.
func TestSessionAllocatesNothingPerRequest(t *testing.T) {
	b := newMemBackend(1 << 20)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	checkNoAllocsPerRequest(t, dialTest(t, rtrs.MinInflight, 1, addr))
}

func checkNoAllocsPerRequest(t *testing.T, c *Client) {
	q := c.Queue(0)
	// Reads and writes, small (answers gathered) and large (read data
	// written from the chunk).
	for _, size := range []int{4096, 32 << 10} {
		for _, write := range []bool{false, true} {
			o := &oneShot{done: make(chan int, 1)}
			o.r = Request{Write: write, Data: make([]byte, size), Usr: o.usr[:], Done: o.onDone}
			submit := func() { q.Submit(&o.r) }
			round := func() {
				q.Do(submit)
				if errno := <-o.done; errno != 0 {
					t.Fatalf("errno %d", errno)
				}
			}
			for i := 0; i < 100; i++ {
				round()
			}
			// Do posts a func, made once: count what a round costs beyond
			// what posting one costs.
			nop := func() { o.done <- 0 }
			base := testing.AllocsPerRun(200, func() { q.Do(nop); <-o.done })
			got := testing.AllocsPerRun(200, round)
			if got-base > 0.05 {
				t.Errorf("size %d write %v: %.2f allocations per request round trip beyond the harness's %.2f", size, write, got-base, base)
			}
		}
	}
}

func waitPathState(t *testing.T, c *Client, idx int, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ps := c.Paths()
		if idx < len(ps) && ps[idx].State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("path %d: state %v, want %s", idx, ps, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A path the server refuses (the same client and server addresses as
// path 0: EEXIST there) keeps trying, and says why; the connected path
// has no error. (Path management itself: TestSessionSuite.)
func TestSessionRefusedPathSaysWhy(t *testing.T) {
	_, addrA := startIOServer(t, newMemBackend(1<<20), "127.0.0.1:0")
	c := dialTest(t, rtrs.RoundRobin, 1, addrA)
	dup, err := c.AddPath(PathAddr{Src: "127.0.0.1", Dst: addrA})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Paths()[dup].LastError == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p := c.Paths()[dup]; p.State == "connected" || p.LastError == "" {
		t.Errorf("duplicate path: state %s, last error %q; want it refused, with the reason", p.State, p.LastError)
	} else {
		t.Logf("duplicate path: %s: %s", p.State, p.LastError)
	}
	if p := c.Paths()[0]; p.LastError != "" {
		t.Errorf("connected path 0 has a last error %q", p.LastError)
	}
}

// loopDriver keeps depth requests in flight on one queue until n have
// completed; everything runs on the queue's thread.
type loopDriver struct {
	q     *ClientQueue
	reqs  []Request
	usr   [][8]byte
	left  int
	inFly int
	done  chan struct{}
}

func (d *loopDriver) start(q *ClientQueue) {
	d.q = q
	for i := range d.reqs {
		if d.left == 0 {
			break
		}
		d.left--
		d.inFly++
		q.Submit(&d.reqs[i])
	}
}

func (d *loopDriver) onDone(r *Request, errno int) {
	if errno != 0 {
		panic(errno)
	}
	if d.left > 0 {
		d.left--
		d.q.Submit(r)
		return
	}
	d.inFly--
	if d.inFly == 0 {
		close(d.done)
	}
}

// BenchmarkSessionWrite4K: 4 KiB writes at queue depth 32 through one
// client queue and the server, both in this process; -benchmem counts the
// allocations of both sides per request.
func BenchmarkSessionWrite4K(b *testing.B) {
	be := newMemBackend(1 << 20)
	srv, err := NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 64}, Handler: be})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c, err := DialClient(context.Background(), ClientConfig{SessName: "bench", Queues: 1,
		Paths: []PathAddr{{Dst: ln.Addr().String()}}, MaxReconnectAttempts: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	d := &loopDriver{reqs: make([]Request, 32), usr: make([][8]byte, 32), left: b.N, done: make(chan struct{})}
	for i := range d.reqs {
		d.reqs[i] = Request{Write: true, Data: make([]byte, 4096), Usr: d.usr[i][:], Done: d.onDone}
	}
	b.ReportAllocs()
	b.SetBytes(4096)
	b.ResetTimer()
	q := c.Queue(0)
	go q.Run(func() { d.start(q) })
	<-d.done
}

// A request that the server holds on a path the client then disconnects is
// resent on the other path with the same chunk. The server serves the
// resend only once the stale request is done with the chunk, and however
// long that takes, the other path stays up.
func TestSessionResendWaitsForStaleRequest(t *testing.T) {
	b := newMemBackend(1 << 20)
	b.hold = true
	srv, addrA := startIOServer(t, b, "127.0.0.1:0")
	addrB := addListener(t, srv)
	c := dialTest(t, rtrs.RoundRobin, 1, addrA, addrB)
	waitPathState(t, c, 1, "connected")
	o := &oneShot{done: make(chan int, 1)}
	o.r = Request{Write: true, Data: make([]byte, 4096), Usr: o.usr[:], Done: o.onDone}
	onQueue(c.Queue(0), func(q *ClientQueue) { q.Submit(&o.r) })
	var stale string
	deadline := time.Now().Add(5 * time.Second)
	for stale == "" {
		b.mu.Lock()
		if len(b.held) > 0 {
			stale = b.held[0].Local.String()
		}
		b.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the write did not reach the server")
		}
		time.Sleep(time.Millisecond)
	}
	idx, other := 0, addrB
	if stale == addrB {
		idx, other = 1, addrA
	}
	if err := c.DisconnectPath(idx); err != nil {
		t.Fatal(err)
	}
	waitPathState(t, c, idx, "disconnected")
	time.Sleep(300 * time.Millisecond) // the resend arrives and must wait
	if n := b.count(other); n != 0 {
		t.Errorf("the resend was served on %s while the stale request held its chunk", other)
	}
	if s := c.Paths()[1-idx].State; s != "connected" {
		t.Errorf("the path of the resend is %s while it waits for the chunk", s)
	}
	b.release()
	select {
	case errno := <-o.done:
		if errno != 0 {
			t.Fatalf("the failed-over write: errno %d", errno)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the failed-over write did not end; paths %v", c.Paths())
	}
	if n := b.count(other); n != 1 {
		t.Errorf("%d requests served on %s, want the resend", n, other)
	}
	if s := c.Paths()[1-idx].State; s != "connected" {
		t.Errorf("the path of the resend is %s", s)
	}
}

// Paths added at once get indexes of their own, and adding one the session
// has at the same time as it is added gives EEXIST once.
func TestSessionAddPathConcurrently(t *testing.T) {
	b := newMemBackend(1 << 20)
	srv, addrA := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.RoundRobin, 1, addrA)
	addrs := []string{addListener(t, srv), addListener(t, srv), addListener(t, srv)}
	type result struct {
		idx int
		err error
	}
	results := make(chan result, 2*len(addrs))
	for _, a := range append(addrs, addrs...) {
		go func(a string) {
			idx, err := c.AddPath(PathAddr{Dst: a})
			results <- result{idx, err}
		}(a)
	}
	seen := map[int]bool{}
	exists := 0
	for range 2 * len(addrs) {
		r := <-results
		switch {
		case errors.Is(r.err, syscall.EEXIST):
			exists++
		case r.err != nil:
			t.Errorf("AddPath: %v", r.err)
		case seen[r.idx] || r.idx < 1 || r.idx > len(addrs):
			t.Errorf("AddPath gave index %d twice or out of 1..%d", r.idx, len(addrs))
		default:
			seen[r.idx] = true
		}
	}
	if exists != len(addrs) || len(c.Paths()) != 1+len(addrs) {
		t.Errorf("%d EEXIST (want %d), %d paths (want %d)", exists, len(addrs), len(c.Paths()), 1+len(addrs))
	}
}

// A connection that carried its byte budget (ClientConfig.RenewBytes, as
// TLS sets it for new keys) makes its path reconnect; the requests fail
// over or wait, and the data stays right.
func TestSessionRenewsConnectionsAfterTheirBudget(t *testing.T) {
	_, addr := startIOServer(t, newMemBackend(16<<20), "127.0.0.1:0")
	cfg := testConfig(rtrs.MinInflight, 2, addr)
	cfg.RenewBytes = 1 << 20
	c := dialTestConfig(t, cfg)
	before := c.Paths()[0].Stats.Snapshot().ReconnectsOK
	for _, v := range runVerifiers(c, 8, 16<<10, 40) {
		v.Wait(t, 60*time.Second)
	}
	// 2 queues × 8 slots × 40 rounds × 16 KiB written and read: about
	// 20 MiB each way, so each connection passed 1 MiB several times.
	if n := c.Paths()[0].Stats.Snapshot().ReconnectsOK - before; n < 3 {
		t.Errorf("%d reconnects for new keys, want several", n)
	} else {
		t.Logf("%d reconnects for new keys", n)
	}
}
