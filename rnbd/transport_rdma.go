package rnbd

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/uring"
)

// RDMA sessions have one memory region for everything their requests
// carry: a part per device (block) for the tag buffers of up to
// maxDevices() mapped devices (each with up to rdmaMaxDepth tags of up to
// rdmaMaxTagBytes per queue), and a last part, a page, for admin answers.
// Registered memory is pinned: a block's part is registered when a device
// first takes the block (and then stays registered while the session
// lives, as the server may still write into it after an unmap), so a
// session pins only what its devices use.
const (
	rdmaMaxDepth    = 128
	rdmaMaxTagBytes = 128 << 10
	rdmaAdminBytes  = 4096
)

// rdmaTransport carries RNBD over RTRS/RDMA. Its last queue is the admin
// queue, run on a goroutine of its own.
type rdmaTransport struct {
	c    *rdmatr.Client
	n    int // queues per device
	slot int // bytes of tag buffers per device
	blocks
	admin   sync.Mutex
	adminQ  *rdmatr.ClientQueue
	threads queueThreads // per RTRS queue, the thread driving it
}

func dialRDMA(ctx context.Context, cfg rdmatr.ClientConfig, maxDevices int) (*rdmaTransport, error) {
	n := cfg.Queues
	if n <= 0 {
		n = numCPU()
	}
	cfg.Queues = n*maxDevices + 1
	slot := n * rdmaMaxDepth * rdmaMaxTagBytes
	cfg.Region, cfg.RegionSize, cfg.RegionPartSize = nil, maxDevices*slot+rdmaAdminBytes, slot
	c, err := rdmatr.DialClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.RegisterPart(maxDevices); err != nil {
		c.Close()
		return nil, err
	}
	t := &rdmaTransport{c: c, n: n, slot: slot, blocks: newBlocks(maxDevices), adminQ: c.Queue(n * maxDevices), threads: make(queueThreads, n*maxDevices)}
	t.adminQ.Unheld() // it reopens the devices while IO is held
	go t.adminQ.Run(nil)
	return t, nil
}

func (t *rdmaTransport) queues() int       { return t.n }
func (t *rdmaTransport) resume(gen uint64) { t.c.ResumeIO(gen) }
func (t *rdmaTransport) maxIOSize() int    { return t.c.Params().MaxIOSize }
func (t *rdmaTransport) close() error      { return t.c.Close() }

func (t *rdmaTransport) call(ctx context.Context, write bool, usr []byte, respLen int) (int, []byte, error) {
	if respLen > rdmaAdminBytes {
		return 0, nil, fmt.Errorf("rnbd: admin answer of %d bytes: %w", respLen, syscall.EINVAL)
	}
	t.admin.Lock()
	defer t.admin.Unlock()
	var data []byte
	if respLen > 0 {
		data = t.c.Region()[t.maxDevices()*t.slot:][:respLen]
	}
	done := make(chan int, 1)
	r := &rdmatr.Request{Write: write, Usr: usr, Data: data, Done: func(_ *rdmatr.Request, e int) { done <- e }}
	t.adminQ.Do(func(q *rdmatr.ClientQueue) {
		if err := q.Submit(r); err != nil {
			done <- -int(syscall.EINVAL)
		}
	})
	select {
	case e := <-done:
		return e, append([]byte(nil), data...), nil
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
}

func (t *rdmaTransport) acquire(size int) (int, []byte, error) {
	if size > t.slot {
		return 0, nil, fmt.Errorf("rnbd: %d bytes of tag buffers, an RDMA session holds %d per device (depth at most %d): %w", size, t.slot, rdmaMaxDepth, syscall.ENOMEM)
	}
	b, err := t.get()
	if err != nil {
		return 0, nil, err
	}
	if err := t.c.RegisterPart(b); err != nil {
		t.put(b)
		return 0, nil, fmt.Errorf("rnbd: tag buffers of %d bytes: %w", t.slot, err)
	}
	off := b * t.slot
	return b, t.c.Region()[off : off+t.slot : off+t.slot], nil
}

func (t *rdmaTransport) release(block int) {
	for i := range t.n {
		t.threads.set(block*t.n+i, 0)
	}
	t.put(block)
}

func (t *rdmaTransport) completionQueues() []CompletionQueue {
	var out []CompletionQueue
	for _, cq := range t.c.CompletionQueues() {
		if cpu, tid := t.threads.cpu(cq.Queue); cpu >= 0 {
			out = append(out, CompletionQueue{Path: cq.Path, Queue: cq.Queue, CPU: cpu, TID: tid, UserHandle: cq.UserHandle})
		}
	}
	return out
}

func (t *rdmaTransport) paths() []PathStatus {
	var out []PathStatus
	for _, p := range t.c.Paths() {
		out = append(out, PathStatus{Index: p.Index, Addr: p.Addr.String(), State: p.State, RTT: p.RTT, LastError: p.LastError, Stats: p.Stats})
	}
	return out
}

func (t *rdmaTransport) pathManager() pathManager { return t.c }

type rdmaQueue struct {
	q    *rdmatr.ClientQueue
	reqs []rdmatr.Request
	done func(tag uint16, errno int)
}

func (t *rdmaTransport) queue(block, i, tid int, ring *uring.Ring, base uint64, depth int, done func(uint16, int)) transportQueue {
	t.threads.set(block*t.n+i, tid)
	rq := &rdmaQueue{q: t.c.Queue(block*t.n + i), reqs: make([]rdmatr.Request, depth), done: done}
	for j := range rq.reqs {
		rq.reqs[j].Tag = uint64(j)
		rq.reqs[j].Done = rq.onDone
	}
	rq.q.Attach(ring, base)
	return rq
}

func (rq *rdmaQueue) submit(tag uint16, write bool, usr, data []byte) error {
	r := &rq.reqs[tag]
	r.Write, r.Usr, r.Data = write, usr, data
	return rq.q.Submit(r)
}

func (rq *rdmaQueue) onDone(r *rdmatr.Request, errno int) { rq.done(uint16(r.Tag), errno) }
func (rq *rdmaQueue) handleCQE(cqe *uring.CQE)            { rq.q.HandleCQE(cqe) }
func (rq *rdmaQueue) flush()                              { rq.q.Flush() }
func (rq *rdmaQueue) detach()                             { rq.q.Detach() }
func (rq *rdmaQueue) do(fn func())                        { rq.q.Do(func(*rdmatr.ClientQueue) { fn() }) }
