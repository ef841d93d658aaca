// Command rtrsbench is urnbd's load generator for the RTRS transports: it
// runs an RTRS server with a memory backend and an RTRS client in one
// process, keeps a fixed number of requests in flight per client queue for
// a while, and prints the IOPS, bandwidth and request latency it reached
// (one JSON object on stdout).
//
//	go run ./tools/rtrsbench -rw randread -bs 4k -iodepth 32 -runtime 10s
//	rtrsbench -transport rdma -src 192.0.2.1 -dst 192.0.2.2 -rw read -bs 128k -iodepth 1 -queues 1
//
// -transport tcp (default) uses package rtrs/tcp on loopback (or -dst);
// -transport rdma uses package rtrs/rdmatr: the server listens on -dst (an
// address of an RDMA device, e.g. the lab's rxe1 at 192.0.2.2) and the
// client connects from -src (e.g. the lab's rxe0 at 192.0.2.1), so the
// traffic crosses the soft-RoCE link.
//
// Each client queue runs on its own OS thread pinned to one CPU, as a ublk
// queue would. The user message of each request is its 8-byte offset.
// Latency is measured per request, from Submit to Done, in 1 µs buckets.
// The memory backend's pages are written once before the run, so that no
// request pays a first-touch page fault. Besides IOPS and latency the
// JSON has cpu_us_per_io (the process's CPU time per request, client and
// server) and machine_busy_us_per_io (every CPU's busy time per request,
// from /proc/stat), both over the measured window only.
package main

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/tlstest"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// memBackend serves requests from one memory region; requests never
// overlap in flight, as the generator keeps them on distinct blocks.
type memBackend struct{ mem []byte }

func (b *memBackend) serve(usr, data []byte, write bool) int {
	if len(usr) != 8 {
		return -22
	}
	off := binary.LittleEndian.Uint64(usr)
	if off+uint64(len(data)) > uint64(len(b.mem)) {
		return -22
	}
	if write {
		copy(b.mem[off:], data)
	} else {
		copy(data, b.mem[off:])
	}
	return 0
}

// HandleIO answers a TCP read from the backend's memory itself (no copy
// into the chunk; see tcp.ServerIO.Data).
func (b *memBackend) HandleIO(io *tcp.ServerIO) {
	if !io.Write && len(io.Usr) == 8 {
		if off := binary.LittleEndian.Uint64(io.Usr); off+uint64(len(io.Data)) <= uint64(len(b.mem)) {
			io.Data = b.mem[off : off+uint64(len(io.Data))]
			io.Complete(0)
			return
		}
	}
	io.Complete(b.serve(io.Usr, io.Data, io.Write))
}

// rdmaBackend is the same backend for the RDMA server.
type rdmaBackend struct{ *memBackend }

func (b rdmaBackend) HandleIO(io *rdmatr.ServerIO) { io.Complete(b.serve(io.Usr, io.Data, io.Write)) }

// latBuckets: 1 µs each up to 1 s; the last one counts everything above.
const latBuckets = 1_000_000

// generator keeps len(usr) requests in flight on one queue until stop.
// The transport-specific part is submit (send slot i's request again with
// its Usr and Write set) and the Done callback, which calls done.
type generator struct {
	submit func(slot int) error
	usr    [][8]byte
	start  []int64
	rng    *rand.Rand
	bs     int
	blocks int
	seq    bool
	next   int
	write  bool
	stop   *atomic.Bool
	ops    atomic.Int64
	errs   atomic.Int64
	hist   []uint32
	active int
	done   chan struct{}
}

func newGenerator(i, n, bs, memSize, queues int, rw string, stop *atomic.Bool) *generator {
	return &generator{usr: make([][8]byte, n), start: make([]int64, n), rng: rand.New(rand.NewSource(int64(i))),
		bs: bs, blocks: memSize / bs, seq: rw == "read" || rw == "write", write: rw == "randwrite" || rw == "write",
		next: i * (memSize / bs / queues), stop: stop, hist: make([]uint32, latBuckets+1), done: make(chan struct{})}
}

var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

func (g *generator) startAll() {
	g.active = len(g.usr)
	for i := range g.usr {
		g.issue(i)
	}
}

func (g *generator) issue(i int) {
	var blk int
	if g.seq {
		blk = g.next % g.blocks
		g.next++
	} else {
		blk = g.rng.Intn(g.blocks)
	}
	binary.LittleEndian.PutUint64(g.usr[i][:], uint64(blk*g.bs))
	g.start[i] = nanotime()
	if err := g.submit(i); err != nil {
		fmt.Fprintln(os.Stderr, "rtrsbench:", err)
		os.Exit(1)
	}
}

func (g *generator) onDone(i, errno int) {
	us := (nanotime() - g.start[i]) / 1000
	if us > latBuckets {
		us = latBuckets
	}
	g.hist[us]++
	if errno != 0 {
		g.errs.Add(1)
	}
	g.ops.Add(1)
	if g.stop.Load() {
		g.active--
		if g.active == 0 {
			close(g.done)
		}
		return
	}
	g.issue(i)
}

func parseSize(s string) int {
	var n int
	var unit string
	fmt.Sscanf(s, "%d%s", &n, &unit)
	switch unit {
	case "k", "K":
		n <<= 10
	case "m", "M":
		n <<= 20
	case "g", "G":
		n <<= 30
	}
	return n
}

// split returns how many of depth requests queue i of queues gets.
func split(depth, queues, i int) int {
	n := depth / queues
	if i < depth%queues {
		n++
	}
	return n
}

func pin(cpu int) {
	var set unix.CPUSet
	set.Set(cpu % runtime.NumCPU())
	unix.SchedSetaffinity(0, &set)
}

type options struct {
	rw, src, dst      string
	bs, memSize       int
	depth, queues, qd int
	chunk             int
	// key, if set, is proved by the client to a server that requires it
	// (sessions), to measure authentication's cost.
	key      *rtrs.Key
	sessions *rtrs.ServerTable
	// serverTLS and clientTLS, if set, run TCP over TLS.
	serverTLS, clientTLS *tls.Config
}

// fatal makes check's exit a tlstest.TB.
type fatal struct{}

func (fatal) Helper()           {}
func (fatal) Fatal(args ...any) { check(fmt.Errorf("%v", fmt.Sprint(args...))) }

func main() {
	transport := flag.String("transport", "tcp", "tcp (rtrs/tcp) or rdma (rtrs/rdmatr)")
	rw := flag.String("rw", "randread", "randread, randwrite, read (sequential) or write (sequential)")
	bsFlag := flag.String("bs", "4k", "block size")
	depth := flag.Int("iodepth", 32, "requests in flight in total (split over the queues)")
	queues := flag.Int("queues", runtime.NumCPU(), "client queues (one thread each)")
	runtimeFlag := flag.Duration("runtime", 10*time.Second, "how long to run")
	size := flag.String("size", "1024M", "size of the memory backend")
	src := flag.String("src", "", "client source address (rdma: the address of the client's RDMA device)")
	dst := flag.String("dst", "127.0.0.1", "server address to listen on (rdma: the address of the server's RDMA device)")
	closeFlag := flag.Bool("close", true, "close client and server at the end (false: exit at once, the kernel frees the RDMA resources)")
	useTLS := flag.Bool("tls", false, "TCP over TLS 1.3 (kTLS: the kernel's tls module), with a throwaway CA")
	auth := flag.Bool("auth", false, "the server requires a key, which the client proves (RTRS authentication)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the measured run to `FILE` (go tool pprof)")
	flag.Parse()

	o := options{rw: *rw, src: *src, dst: *dst, bs: parseSize(*bsFlag), memSize: parseSize(*size), depth: *depth, queues: *queues}
	if *auth {
		k, err := rtrs.GenerateKey("rtrsbench")
		check(err)
		ring, err := rtrs.NewKeyRing([]rtrs.Key{k})
		check(err)
		o.key = &k
		o.sessions = rtrs.NewServerTable(rtrs.ServerTableConfig{Auth: rtrs.ServerAuth{Keys: ring, Required: true}})
	}
	if *useTLS {
		ca := tlstest.NewCA(fatal{}, "rtrsbench")
		o.serverTLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(fatal{}, "rtrsbench")}}
		o.clientTLS = &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}
	}
	if o.bs <= 0 || o.memSize < o.bs || o.depth < o.queues || o.queues < 1 {
		check(fmt.Errorf("bad -bs %q, -size %q, -iodepth %d or -queues %d (iodepth must be >= queues)", *bsFlag, *size, *depth, *queues))
	}
	switch o.rw {
	case "randread", "randwrite", "read", "write":
	default:
		check(fmt.Errorf("bad -rw %q", o.rw))
	}
	// Requests up to 128 KiB need chunks of 256 KiB: a chunk also holds
	// the 4 KiB header area (max_io_size = max_chunk_size - 4096).
	o.chunk = rtrs.DefaultMaxChunkSize
	for o.chunk-rtrs.DefaultMaxHdrSize < o.bs {
		o.chunk *= 2
	}
	// Server chunks (sess_queue_depth): a power of two above the depth.
	o.qd = 64
	for o.qd < 2*o.depth {
		o.qd *= 2
	}
	backend := &memBackend{mem: make([]byte, o.memSize)}
	touchPages(backend.mem)
	var stop atomic.Bool
	var gens []*generator
	for i := 0; i < o.queues; i++ {
		gens = append(gens, newGenerator(i, split(o.depth, o.queues, i), o.bs, o.memSize, o.queues, o.rw, &stop))
	}
	var closeAll func()
	switch *transport {
	case "tcp":
		closeAll = runTCP(o, backend, gens)
	case "rdma":
		closeAll = runRDMA(o, backend, gens)
	default:
		check(fmt.Errorf("bad -transport %q", *transport))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		check(err)
		check(pprof.StartCPUProfile(f))
	}
	cpu0, busy0 := processCPU(), machineBusy()
	t0 := time.Now()
	var ops0 int64 // done before the window: the generators run from their queues' start
	for _, g := range gens {
		ops0 += g.ops.Load()
	}
	time.Sleep(*runtimeFlag)
	stop.Store(true)
	pprof.StopCPUProfile()
	var ops, errs int64
	hist := make([]uint64, latBuckets+1)
	for _, g := range gens {
		<-g.done
		ops += g.ops.Load()
		errs += g.errs.Load()
		for i, n := range g.hist {
			hist[i] += uint64(n)
		}
	}
	el := time.Since(t0).Seconds()
	ops -= ops0
	cpu, busy1 := processCPU()-cpu0, machineBusy()
	res := map[string]any{"transport": *transport, "rw": o.rw, "bs": o.bs, "iodepth": o.depth, "queues": o.queues, "seconds": el,
		"ios": ops, "errors": errs, "iops": float64(ops) / el, "mib_s": float64(ops) * float64(o.bs) / el / (1 << 20),
		"auth": o.key != nil, "tls": o.clientTLS != nil, "cpu_us_per_io": cpu.Seconds() * 1e6 / float64(max(ops, 1))}
	if busy0 >= 0 && busy1 >= 0 {
		res["machine_busy_us_per_io"] = (busy1 - busy0).Seconds() * 1e6 / float64(max(ops, 1))
	}
	for k, v := range latencies(hist) {
		res[k] = v
	}
	// The results go out before the teardown, which is not measured.
	json.NewEncoder(os.Stdout).Encode(res)
	if *closeFlag {
		closeAll()
	}
	if errs > 0 {
		os.Exit(1)
	}
}

// processCPU returns the CPU time (user and system) the process used so
// far: client and server together.
func processCPU() time.Duration {
	var ru unix.Rusage
	check(unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// touchPages writes every page of mem once. A fresh allocation is
// untouched anonymous memory: the first write to each page would fault
// and zero it (or a whole 2 MiB page, with transparent huge pages) inside
// the measured run, and a read would see the shared zero page; neither is
// what a backend's memory costs once in use.
func touchPages(mem []byte) {
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 0 // a write fault all the same
	}
}

// machineBusy returns the CPU time every CPU of the machine spent busy so
// far (the first line of /proc/stat: all but idle and iowait), or -1 if it
// cannot be read. Beside the process's own CPU time it counts what that
// may miss: interrupts, softirqs (the network stack's receive side) and
// kernel threads working for the process.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return -1
	}
	var ticks int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return -1
		}
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest time is in user already
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// latencies returns the mean and percentiles (µs) of a histogram.
func latencies(hist []uint64) map[string]float64 {
	var n, sum uint64
	for us, c := range hist {
		n += c
		sum += uint64(us) * c
	}
	m := map[string]float64{}
	if n == 0 {
		return m
	}
	m["lat_mean_us"] = float64(sum)/float64(n) + 0.5 // bucket us holds [us, us+1)
	for _, p := range []struct {
		name string
		q    float64
	}{{"lat_p50_us", 0.50}, {"lat_p99_us", 0.99}, {"lat_p999_us", 0.999}} {
		want := uint64(p.q*float64(n) + 0.5)
		if want < 1 {
			want = 1
		}
		var acc uint64
		for us, c := range hist {
			acc += c
			if acc >= want {
				m[p.name] = float64(us)
				break
			}
		}
	}
	return m
}

// runTCP starts the RTRS/TCP server and client on o.dst and the generators
// on the client's queues; the returned function closes everything.
func runTCP(o options, backend *memBackend, gens []*generator) func() {
	srv, err := tcp.NewServer(tcp.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 512, ChunkSize: o.chunk, Sessions: o.sessions}, Handler: backend, TLS: o.serverTLS})
	check(err)
	ln, err := net.Listen("tcp", net.JoinHostPort(o.dst, "0"))
	check(err)
	go srv.Serve(ln)
	path := tcp.PathAddr{Dst: ln.Addr().String()}
	if o.src != "" {
		path.Src = o.src
	}
	c, err := tcp.DialClient(context.Background(), tcp.ClientConfig{
		SessName: "rtrsbench", Paths: []tcp.PathAddr{path}, Queues: o.queues,
		Policy: rtrs.MinInflight, MaxReconnectAttempts: -1, Key: o.key, TLS: o.clientTLS,
	})
	check(err)
	var wg sync.WaitGroup
	for i, g := range gens {
		reqs := make([]tcp.Request, len(g.usr))
		done := func(r *tcp.Request, errno int) { g.onDone(int(r.Tag), errno) }
		for j := range reqs {
			reqs[j] = tcp.Request{Data: make([]byte, o.bs), Tag: uint64(j), Done: done}
		}
		q := c.Queue(i)
		g.submit = func(j int) error {
			r := &reqs[j]
			r.Usr, r.Write = g.usr[j][:], g.write
			return q.Submit(r)
		}
		wg.Add(1)
		go func(cpu int) {
			defer wg.Done()
			check(q.Run(func() { pin(cpu); g.startAll() }))
		}(i)
	}
	return func() { c.Close(); wg.Wait(); srv.Close() }
}

// runRDMA starts the RTRS/RDMA server on o.dst and the client from o.src
// (request data in the client's registered region), and the generators.
func runRDMA(o options, backend *memBackend, gens []*generator) func() {
	dst, err := netip.ParseAddr(o.dst)
	check(err)
	srv, err := rdmatr.NewServer(rdmatr.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: o.qd, ChunkSize: o.chunk, Sessions: o.sessions, Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "rtrsbench: server: "+f+"\n", a...) }}, Handler: rdmaBackend{backend}})
	check(err)
	addr, err := srv.Listen(netip.AddrPortFrom(dst, 0))
	check(err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := rdmatr.DialClient(ctx, rdmatr.ClientConfig{ClientConfig: rtrs.ClientConfig{
		SessName: "rtrsbench", Paths: []rdmatr.PathAddr{{Src: o.src, Dst: addr.String()}}, Queues: o.queues,
		Policy: rtrs.MinInflight, MaxReconnectAttempts: -1, Timeout: 30 * time.Second, Key: o.key,
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "rtrsbench: client: "+f+"\n", a...) },
	}, RegionSize: o.depth * o.bs})
	check(err)
	if mx := c.Params().MaxIOSize; o.bs > mx {
		check(fmt.Errorf("block size %d > max_io_size %d", o.bs, mx))
	}
	region := c.Region()
	var wg sync.WaitGroup
	slot := 0
	for i, g := range gens {
		reqs := make([]rdmatr.Request, len(g.usr))
		done := func(r *rdmatr.Request, errno int) { g.onDone(int(r.Tag), errno) }
		for j := range reqs {
			reqs[j] = rdmatr.Request{Data: region[slot*o.bs : (slot+1)*o.bs : (slot+1)*o.bs], Tag: uint64(j), Done: done}
			slot++
		}
		q := c.Queue(i)
		g.submit = func(j int) error {
			r := &reqs[j]
			r.Usr, r.Write = g.usr[j][:], g.write
			return q.Submit(r)
		}
		wg.Add(1)
		go func(cpu int) {
			defer wg.Done()
			check(q.Run(func() { pin(cpu); g.startAll() }))
		}(i)
	}
	return func() { c.Close(); wg.Wait(); srv.Close() }
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "rtrsbench:", err)
		os.Exit(1)
	}
}
