// Command rtrsbench is urnbd's load generator for the RTRS transport: it
// runs an RTRS server with a memory backend and an RTRS client on loopback
// in one process, keeps a fixed number of requests in flight per client
// queue for a while, and prints the IOPS and bandwidth it reached.
//
//	go run ./tools/rtrsbench -rw randread -bs 4k -iodepth 32 -runtime 10s
//
// Each client queue runs on its own OS thread pinned to one CPU, as a ublk
// queue would. The user message of each request is its 8-byte offset.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// memBackend serves requests from one memory region; requests never
// overlap in flight, as the generator keeps them on distinct blocks.
type memBackend struct{ mem []byte }

func (b *memBackend) HandleIO(io *tcp.ServerIO) {
	off := binary.LittleEndian.Uint64(io.Usr)
	if io.Write {
		copy(b.mem[off:], io.Data)
	} else {
		copy(io.Data, b.mem[off:])
	}
	io.Complete(0)
}

// generator keeps depth requests in flight on one queue until stop.
type generator struct {
	q      *tcp.ClientQueue
	reqs   []tcp.Request
	usr    [][8]byte
	rng    *rand.Rand
	bs     int
	blocks int
	seq    bool
	next   int
	write  bool
	stop   *atomic.Bool
	ops    atomic.Int64
	errs   atomic.Int64
	active int
	done   chan struct{}
}

func (g *generator) start(q *tcp.ClientQueue) {
	g.q = q
	g.active = len(g.reqs)
	for i := range g.reqs {
		g.issue(&g.reqs[i])
	}
}

func (g *generator) issue(r *tcp.Request) {
	var blk int
	if g.seq {
		blk = g.next % g.blocks
		g.next++
	} else {
		blk = g.rng.Intn(g.blocks)
	}
	i := int(r.Tag)
	binary.LittleEndian.PutUint64(g.usr[i][:], uint64(blk*g.bs))
	r.Usr, r.Write = g.usr[i][:], g.write
	if err := g.q.Submit(r); err != nil {
		fmt.Fprintln(os.Stderr, "rtrsbench:", err)
		os.Exit(1)
	}
}

func (g *generator) onDone(r *tcp.Request, errno int) {
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
	g.issue(r)
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
	}
	return n
}

func main() {
	rw := flag.String("rw", "randread", "randread, randwrite, read (sequential) or write (sequential)")
	bsFlag := flag.String("bs", "4k", "block size")
	depth := flag.Int("iodepth", 32, "requests in flight in total (split over the queues)")
	queues := flag.Int("queues", runtime.NumCPU(), "client queues (one thread each)")
	runtimeFlag := flag.Duration("runtime", 10*time.Second, "how long to run")
	size := flag.String("size", "1024M", "size of the memory backend")
	flag.Parse()

	bs, memSize := parseSize(*bsFlag), parseSize(*size)
	backend := &memBackend{mem: make([]byte, memSize)}
	// Requests up to 128 KiB need chunks of 256 KiB: a chunk also holds
	// the 4 KiB header area (max_io_size = max_chunk_size - 4096).
	chunk := rtrs.DefaultMaxChunkSize
	for chunk-rtrs.DefaultMaxHdrSize < bs {
		chunk *= 2
	}
	srv, err := tcp.NewServer(tcp.ServerConfig{QueueDepth: 512, ChunkSize: chunk, Handler: backend})
	check(err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go srv.Serve(ln)
	defer srv.Close()

	c, err := tcp.DialClient(context.Background(), tcp.ClientConfig{
		SessName: "rtrsbench", Paths: []tcp.PathAddr{{Dst: ln.Addr().String()}}, Queues: *queues,
		Policy: rtrs.MinInflight, MaxReconnectAttempts: -1,
	})
	check(err)
	var stop atomic.Bool
	var gens []*generator
	var wg sync.WaitGroup
	for i := 0; i < *queues; i++ {
		n := *depth / *queues
		if i < *depth%*queues {
			n++
		}
		g := &generator{reqs: make([]tcp.Request, n), usr: make([][8]byte, n), rng: rand.New(rand.NewSource(int64(i))),
			bs: bs, blocks: memSize / bs, seq: *rw == "read" || *rw == "write", write: *rw == "randwrite" || *rw == "write",
			next: i * (memSize / bs / *queues), stop: &stop, done: make(chan struct{})}
		for j := range g.reqs {
			g.reqs[j] = tcp.Request{Data: make([]byte, bs), Tag: uint64(j), Done: g.onDone}
		}
		gens = append(gens, g)
		wg.Add(1)
		go func(q *tcp.ClientQueue, cpu int) {
			defer wg.Done()
			check(q.Run(func(q *tcp.ClientQueue) {
				var set unix.CPUSet
				set.Set(cpu % runtime.NumCPU())
				unix.SchedSetaffinity(0, &set)
				g.start(q)
			}))
		}(c.Queue(i), i)
	}
	t0 := time.Now()
	time.Sleep(*runtimeFlag)
	stop.Store(true)
	var ops, errs int64
	for _, g := range gens {
		<-g.done
		ops += g.ops.Load()
		errs += g.errs.Load()
	}
	el := time.Since(t0).Seconds()
	c.Close()
	wg.Wait()
	res := map[string]any{"rw": *rw, "bs": bs, "iodepth": *depth, "queues": *queues, "seconds": el,
		"ios": ops, "errors": errs, "iops": float64(ops) / el, "mib_s": float64(ops) * float64(bs) / el / (1 << 20)}
	json.NewEncoder(os.Stdout).Encode(res)
	if errs > 0 {
		os.Exit(1)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "rtrsbench:", err)
		os.Exit(1)
	}
}
