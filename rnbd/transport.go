package rnbd

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/uring"
)

// rtrsSession is what the RNBD client needs of an RTRS client session;
// the clients of both transports (tcp.Client, rdmatr.Client) have it.
type rtrsSession interface {
	Params() rtrs.Params
	Paths() []rtrs.ClientPathInfo
	ResumeIO(gen uint64)
	pathManager
	Close() error
}

// pathManager manages a session's paths at run time.
type pathManager interface {
	AddPath(a rtrs.PathAddr) (int, error)
	RemovePath(idx int) error
	DisconnectPath(idx int) error
	ReconnectPath(idx int) error
	SetPolicy(p rtrs.MPPolicy)
	SetMaxReconnectAttempts(n int) error
}

// transport is an RTRS client session as RNBD uses it, on either
// transport: per-CPU queues in blocks, one block per mapped device (each
// RTRS queue serves one ublk queue, on its thread), and the admin queue,
// run on a goroutine of its own, for session info, open and close.
type transport struct {
	s     rtrsSession
	queue func(i int) rtrs.Queue // the session's queue i
	admin rtrs.Queue
	n     int // queues per device
	blocks
	// mem is the registered memory of an RDMA session, which the tags'
	// buffers and admin answers must come from; nil over TCP (any memory).
	mem *regionMemory
	// fixedReads: the queues read answers straight into a fixed buffer
	// of the ring (rtrs.Request.Fixed), as over TCP.
	fixedReads bool
	cqs        func() []rdmatr.CQInfo // RDMA: the connections' completion queues
	threads    queueThreads           // per RTRS queue, the thread driving it
}

// queuesPerDevice returns the per-CPU queues of each device of a session:
// cfg.Queues, or the number of CPUs.
func queuesPerDevice(cfg *rtrs.ClientConfig) int {
	if cfg.Queues > 0 {
		return cfg.Queues
	}
	return runtime.NumCPU()
}

func newTransport(s rtrsSession, queue func(int) rtrs.Queue, admin rtrs.Queue, n, maxDevices int) *transport {
	t := &transport{s: s, queue: queue, admin: admin, n: n, blocks: newBlocks(maxDevices), threads: make(queueThreads, n*maxDevices)}
	go admin.Run(nil)
	return t
}

func dialTCP(ctx context.Context, cfg rtrs.ClientConfig, maxDevices int) (*transport, error) {
	n := queuesPerDevice(&cfg)
	cfg.Queues, cfg.AdminQueue = n*maxDevices, true
	c, err := tcp.DialClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t := newTransport(c, func(i int) rtrs.Queue { return c.Queue(i) }, c.Admin(), n, maxDevices)
	t.fixedReads = true
	return t, nil
}

func dialRDMA(ctx context.Context, cfg rtrs.ClientConfig, maxDevices int) (*transport, error) {
	n := queuesPerDevice(&cfg)
	cfg.Queues, cfg.AdminQueue = n*maxDevices, true
	slot := n * rdmaMaxDepth * rdmaMaxTagBytes
	c, err := rdmatr.DialClient(ctx, rdmatr.ClientConfig{ClientConfig: cfg,
		RegionSize: maxDevices*slot + rdmaAdminBytes, RegionPartSize: slot})
	if err != nil {
		return nil, err
	}
	if err := c.RegisterPart(maxDevices); err != nil { // the admin answers' part
		c.Close()
		return nil, err
	}
	t := newTransport(c, func(i int) rtrs.Queue { return c.Queue(i) }, c.Admin(), n, maxDevices)
	t.mem = &regionMemory{c: c, slot: slot, maxDevices: maxDevices}
	t.cqs = c.CompletionQueues
	return t, nil
}

func (t *transport) queues() int       { return t.n }
func (t *transport) resume(gen uint64) { t.s.ResumeIO(gen) }
func (t *transport) maxIOSize() int    { return t.s.Params().MaxIOSize }
func (t *transport) close() error      { return t.s.Close() }

func (t *transport) pathManager() pathManager { return t.s }

// call sends an admin message and waits; a read (respLen > 0) returns
// the answer's bytes. errno is the server's answer (0 or negative).
func (t *transport) call(ctx context.Context, write bool, usr []byte, respLen int) (errno int, resp []byte, err error) {
	var data []byte
	if t.mem != nil {
		unlock, buf, err := t.mem.adminBuffer(respLen)
		if err != nil {
			return 0, nil, err
		}
		defer unlock()
		data = buf
	} else if respLen > 0 {
		data = make([]byte, respLen)
	}
	done := make(chan int, 1)
	r := &rtrs.Request{Write: write, Usr: usr, Data: data, Done: func(_ *rtrs.Request, e int) { done <- e }}
	t.admin.Do(func() {
		if err := t.admin.Submit(r); err != nil {
			done <- -int(syscall.EINVAL)
		}
	})
	select {
	case e := <-done:
		if t.mem != nil {
			data = append([]byte(nil), data...) // the region's buffer is the next call's
		}
		return e, data, nil
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
}

// acquire reserves a block of per-CPU queues for one mapped device, and
// the memory its tag buffers must come from (nil: any memory).
func (t *transport) acquire(bufBytes int) (block int, bufs []byte, err error) {
	if t.mem != nil {
		if err := t.mem.fits(bufBytes); err != nil {
			return 0, nil, err
		}
	}
	if block, err = t.get(); err != nil {
		return 0, nil, err
	}
	if t.mem != nil {
		if bufs, err = t.mem.part(block); err != nil {
			t.put(block)
			return 0, nil, err
		}
	}
	return block, bufs, nil
}

// release returns what acquire reserved.
func (t *transport) release(block int) {
	for i := range t.n {
		t.threads.set(block*t.n+i, 0)
	}
	t.put(block)
}

// completionQueues lists the RDMA completion queues of attached block
// queues (none over TCP, whose queues are woken by their sockets).
func (t *transport) completionQueues() []CompletionQueue {
	if t.cqs == nil {
		return nil
	}
	var out []CompletionQueue
	for _, cq := range t.cqs() {
		if cpu, tid := t.threads.cpu(cq.Queue); cpu >= 0 {
			out = append(out, CompletionQueue{Path: cq.Path, Queue: cq.Queue, CPU: cpu, TID: tid, UserHandle: cq.UserHandle})
		}
	}
	return out
}

// paths describes the session's paths.
func (t *transport) paths() []PathStatus {
	var out []PathStatus
	for _, p := range t.s.Paths() {
		out = append(out, PathStatus{Index: p.Index, Addr: p.Addr.String(), State: p.State, RTT: p.RTT, LastError: p.LastError, Stats: p.Stats})
	}
	return out
}

// blockQueue is one per-CPU queue of a block, attached to a ublk queue's
// io_uring: block requests go out on it and their completions come back
// through it, on the ublk queue's thread.
type blockQueue struct {
	q    rtrs.Queue
	reqs []rtrs.Request // by tag
	done func(tag uint16, errno int)
}

// blockQueue binds queue i of a block to a ublk queue's ring; it is called on
// the ublk queue's thread, whose id is tid.
func (t *transport) blockQueue(block, i, tid int, ring *uring.Ring, base uint64, depth int, done func(tag uint16, errno int)) *blockQueue {
	qi := block*t.n + i
	t.threads.set(qi, tid)
	bq := &blockQueue{q: t.queue(qi), reqs: make([]rtrs.Request, depth), done: done}
	for j := range bq.reqs {
		bq.reqs[j].Tag = uint64(j)
		bq.reqs[j].Done = bq.onDone
	}
	bq.q.Attach(ring, base)
	return bq
}

// submit sends the request of tag; fixed says that its data has pages of
// its own, fixed buffer tag of the ring (a zero-copy ublk request), which a
// read may be answered into in part (split).
func (bq *blockQueue) submit(tag uint16, write, fixed bool, usr, data []byte) error {
	r := &bq.reqs[tag]
	r.Write, r.Usr, r.Data = write, usr, data
	r.Fixed, r.BufIndex, r.FixedBase, r.Split = fixed && !write, tag, 0, len(data)
	return bq.q.Submit(r)
}

// split returns how much of the data of tag's read is in its Data, the
// rest being in its fixed buffer only.
func (bq *blockQueue) split(tag uint16) int {
	if r := &bq.reqs[tag]; r.Fixed {
		return r.Split
	}
	return len(bq.reqs[tag].Data)
}

func (bq *blockQueue) onDone(r *rtrs.Request, errno int) { bq.done(uint16(r.Tag), errno) }

// PathStatus describes one RTRS path of a session.
type PathStatus struct {
	Index int    // the path's index in its session, for path commands
	Addr  string // "[src@]dst"
	State string
	// RTT is the last heartbeat round trip (the kernel's cur_latency);
	// zero before the first heartbeat is answered.
	RTT time.Duration
	// LastError is why the last connect attempt failed ("" after one
	// succeeded).
	LastError string
	Stats     *rtrs.ClientPathStats
}

// blocks hands out queue blocks: each mapped device has a block of
// per-CPU RTRS queues of its own.
type blocks struct {
	mu   sync.Mutex
	used []bool
}

func newBlocks(n int) blocks { return blocks{used: make([]bool, n)} }

func (b *blocks) maxDevices() int { return len(b.used) }

func (b *blocks) get() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.used {
		if !b.used[i] {
			b.used[i] = true
			return i, nil
		}
	}
	return 0, fmt.Errorf("rnbd: the session maps at most %d devices at a time; map more under another session name: %w", len(b.used), syscall.ENOSPC)
}

func (b *blocks) put(i int) {
	b.mu.Lock()
	b.used[i] = false
	b.mu.Unlock()
}
