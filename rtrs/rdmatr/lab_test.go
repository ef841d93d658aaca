package rdmatr

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/rtrs"
)

// Lab tests: soft-RoCE (rxe) in the qemu lab, path 1 192.0.2.1 (rxe0) ↔
// 192.0.2.2 (rxe1), path 2 198.51.100.1 (rxe2) ↔ 198.51.100.2 (rxe3); the
// server listens on the .2 addresses. They skip on hosts without RDMA.

var (
	cli1 = netip.MustParseAddr("192.0.2.1")
	srv1 = netip.MustParseAddr("192.0.2.2")
	cli2 = netip.MustParseAddr("198.51.100.1")
	srv2 = netip.MustParseAddr("198.51.100.2")
)

const (
	labQD    = 64
	labChunk = 64 << 10
	blockSz  = 16 << 10
)

var provisionOnce sync.Once

// repoRoot finds the repository root from this file's path, so the tests
// do not depend on the working directory.
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	dir := filepath.Dir(file)
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}

func needLab(t testing.TB) {
	t.Helper()
	if labtest.InLab() {
		provisionOnce.Do(func() {
			prov := filepath.Join(repoRoot(t), "tools", "lab", "provision.sh")
			t0 := time.Now()
			labtest.Run(t, prov, "modules")
			labtest.Run(t, prov, "rdma")
			t.Logf("soft-RoCE provisioned in %v", time.Since(t0).Round(time.Millisecond))
		})
	}
	labtest.Need(t, "/dev/infiniband/rdma_cm", "rdma_ucm")
}

// memBackend is a ServerHandler over memory: the user message is the le64
// byte offset of the block.
type memBackend struct {
	mem   []byte
	ios   atomic.Int64
	paths sync.Map // local address → count
}

func (m *memBackend) HandleIO(io *ServerIO) {
	m.ios.Add(1)
	v, _ := m.paths.LoadOrStore(io.Local.Addr(), new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	if len(io.Usr) != 8 {
		io.Complete(-22)
		return
	}
	off := int(binary.LittleEndian.Uint64(io.Usr))
	if off < 0 || off+len(io.Data) > len(m.mem) {
		io.Complete(-22)
		return
	}
	if io.Write {
		copy(m.mem[off:], io.Data)
	} else {
		copy(io.Data, m.mem[off:off+len(io.Data)])
	}
	io.Complete(0)
}

func pattern(b []byte, block, gen int) {
	binary.LittleEndian.PutUint64(b, uint64(block))
	binary.LittleEndian.PutUint64(b[8:], uint64(gen))
	for i := 16; i < len(b); i++ {
		b[i] = byte(block*31 + gen*7 + i)
	}
}

func checkPattern(b []byte, block, gen int) error {
	if got := binary.LittleEndian.Uint64(b); got != uint64(block) {
		return fmt.Errorf("block %d: header says block %d", block, got)
	}
	if got := binary.LittleEndian.Uint64(b[8:]); got != uint64(gen) {
		return fmt.Errorf("block %d: generation %d, want %d", block, got, gen)
	}
	for i := 16; i < len(b); i++ {
		if b[i] != byte(block*31+gen*7+i) {
			return fmt.Errorf("block %d gen %d: byte %d is %#x", block, gen, i, b[i])
		}
	}
	return nil
}

// driver runs, on one queue, slots that each write a block then read it
// back and check it, over and over, until stop.
type driver struct {
	q      *ClientQueue
	slots  []*slotReq
	blocks int // blocks per slot
	stop   atomic.Bool
	ops    atomic.Int64
	errs   chan error
	live   int
	done   chan struct{}
}

type slotReq struct {
	d     *driver
	r     Request
	usr   [8]byte
	buf   []byte
	k     int // slot index in the whole test (for distinct blocks)
	nslot int
	n     int // op counter
	block int
	gen   int
}

func (s *slotReq) next() {
	d := s.d
	if d.stop.Load() {
		d.live--
		if d.live == 0 {
			close(d.done)
		}
		return
	}
	write := s.n%2 == 0
	if write {
		s.block = s.k + s.nslot*((s.n/2)%d.blocks)
		s.gen = s.n / 2
		pattern(s.buf, s.block, s.gen)
	} else {
		clear(s.buf)
	}
	binary.LittleEndian.PutUint64(s.usr[:], uint64(s.block*blockSz))
	s.r.Write, s.r.Usr, s.r.Data = write, s.usr[:], s.buf
	if err := d.q.Submit(&s.r); err != nil {
		d.fail(err)
	}
}

func (d *driver) fail(err error) {
	select {
	case d.errs <- err:
	default:
	}
	d.stop.Store(true)
}

func (s *slotReq) onDone(r *Request, errno int) {
	d := s.d
	if errno != 0 {
		d.fail(fmt.Errorf("queue %d slot %d op %d (write %v): errno %d", d.q.ID(), s.k, s.n, r.Write, errno))
	} else if !r.Write {
		if err := checkPattern(s.buf, s.block, s.gen); err != nil {
			d.fail(fmt.Errorf("queue %d slot %d: %w", d.q.ID(), s.k, err))
		}
	}
	s.n++
	d.ops.Add(1)
	s.next()
}

type labEnv struct {
	srv     *Server
	backend *memBackend
	addrs   []netip.AddrPort
	cl      *Client
	drivers []*driver
	runErr  chan error
}

func startLab(t *testing.T, paths int, queues, slotsPerQueue int, hb time.Duration) *labEnv {
	t.Helper()
	needLab(t)
	e := &labEnv{backend: &memBackend{mem: make([]byte, queues*slotsPerQueue*4*blockSz)}, runErr: make(chan error, queues)}
	var err error
	e.srv, err = NewServer(ServerConfig{QueueDepth: labQD, ChunkSize: labChunk, Handler: e.backend, HeartbeatInterval: hb, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.srv.Close() })
	srvs, clis := []netip.Addr{srv1, srv2}, []netip.Addr{cli1, cli2}
	var pa []PathAddr
	for i := 0; i < paths; i++ {
		a, err := e.srv.Listen(netip.AddrPortFrom(srvs[i], 0))
		if err != nil {
			t.Fatal(err)
		}
		e.addrs = append(e.addrs, a)
		pa = append(pa, PathAddr{Src: clis[i].String(), Dst: a.String()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.cl, err = DialClient(ctx, ClientConfig{SessName: "labsess", Paths: pa, Queues: queues, Policy: rtrs.RoundRobin,
		RegionSize: queues * slotsPerQueue * blockSz, ReconnectDelay: 200 * time.Millisecond, MaxReconnectAttempts: -1,
		HeartbeatInterval: hb, Timeout: 10 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		t0 := time.Now()
		e.cl.Close()
		t.Logf("client closed in %v", time.Since(t0).Round(time.Millisecond))
	})
	p := e.cl.Params()
	t.Logf("session: queue_depth %d, max_io_size %d, max_hdr_size %d, chunk %d, flags %#x", p.QueueDepth, p.MaxIOSize, p.MaxHdrSize, p.ChunkSize, p.Flags)
	// Wait for all paths (the others connect in the background).
	deadline := time.Now().Add(20 * time.Second)
	for {
		up := 0
		for _, pi := range e.cl.Paths() {
			if pi.State == "connected" {
				up++
			}
		}
		if up == paths {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("paths: %+v", e.cl.Paths())
		}
		time.Sleep(20 * time.Millisecond)
	}
	region := e.cl.Region()
	nslot := queues * slotsPerQueue
	for qi := 0; qi < queues; qi++ {
		d := &driver{q: e.cl.Queue(qi), blocks: 4, errs: make(chan error, 1), done: make(chan struct{}), live: slotsPerQueue}
		for j := 0; j < slotsPerQueue; j++ {
			k := qi*slotsPerQueue + j
			s := &slotReq{d: d, k: k, nslot: nslot, buf: region[k*blockSz : (k+1)*blockSz]}
			s.r.Done = s.onDone
			d.slots = append(d.slots, s)
		}
		e.drivers = append(e.drivers, d)
		go func() {
			e.runErr <- d.q.Run(func(q *ClientQueue) {
				for _, s := range d.slots {
					s.next()
				}
			})
		}()
	}
	return e
}

// stopAndCheck stops the drivers, waits for their requests and checks
// there was no error.
func (e *labEnv) stopAndCheck(t *testing.T) int64 {
	t.Helper()
	var total int64
	for _, d := range e.drivers {
		d.stop.Store(true)
	}
	for _, d := range e.drivers {
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("queue %d: requests did not end", d.q.ID())
		}
		select {
		case err := <-d.errs:
			t.Error(err)
		default:
		}
		total += d.ops.Load()
	}
	return total
}

func (e *labEnv) logStats(t *testing.T) {
	for _, pi := range e.cl.Paths() {
		var b []byte
		b = pi.Stats.AppendRdma(b)
		t.Logf("path %d %v: %s, rtt %v, rdma stats: %s", pi.Index, pi.Addr, pi.State, pi.RTT, b)
	}
}

func TestLabReadWrite(t *testing.T) {
	e := startLab(t, 1, 2, 8, 0)
	time.Sleep(2 * time.Second)
	ops := e.stopAndCheck(t)
	t.Logf("%d requests (half writes, half reads checked) in 2 s; server saw %d", ops, e.backend.ios.Load())
	if ops < 100 {
		t.Errorf("only %d requests", ops)
	}
	e.logStats(t)
}

func TestLabFailoverReconnect(t *testing.T) {
	e := startLab(t, 2, 2, 8, 200*time.Millisecond)
	time.Sleep(time.Second)
	before := e.drivers[0].ops.Load() + e.drivers[1].ops.Load()
	n := e.srv.DisconnectPaths(srv1)
	t.Logf("server closed %d path(s) on %v after %d requests", n, srv1, before)
	if n != 1 {
		t.Fatalf("closed %d paths", n)
	}
	// The client must fail over to path 2, then reconnect path 1.
	deadline := time.Now().Add(20 * time.Second)
	var sawDown bool
	for {
		pi := e.cl.Paths()
		if pi[0].State != "connected" {
			sawDown = true
		}
		if sawDown && pi[0].State == "connected" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("path 1 did not come back: %+v (saw down %v)", pi, sawDown)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second)
	ops := e.stopAndCheck(t)
	var failovers uint64
	for _, pi := range e.cl.Paths() {
		failovers += pi.Stats.Snapshot().Failovers
	}
	t.Logf("%d requests in total, %d failed over; server paths: %d", ops, failovers, e.srv.PathCount())
	e.backend.paths.Range(func(k, v any) bool {
		t.Logf("server address %v served %d requests", k, v.(*atomic.Int64).Load())
		return true
	})
	e.logStats(t)
	for _, pi := range e.cl.Paths() {
		if pi.RTT <= 0 {
			t.Errorf("path %d: no heartbeat round trip measured", pi.Index)
		}
	}
}
