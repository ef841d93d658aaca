package rnbd

import (
	"context"
	"syscall"

	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/uring"
)

// tcpTransport carries RNBD over RTRS/TCP; admin messages use the
// session's admin queue, run on a goroutine of its own.
type tcpTransport struct {
	c *tcp.Client
	n int // queues per device
	blocks
}

func dialTCP(ctx context.Context, cfg tcp.ClientConfig, maxDevices int) (*tcpTransport, error) {
	n := cfg.Queues
	if n <= 0 {
		n = numCPU()
	}
	cfg.Queues, cfg.AdminQueue = n*maxDevices, true
	c, err := tcp.DialClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	go c.Admin().Run(nil)
	return &tcpTransport{c: c, n: n, blocks: newBlocks(maxDevices)}, nil
}

func (t *tcpTransport) acquire(int) (int, []byte, error) {
	b, err := t.get()
	return b, nil, err
}

func (t *tcpTransport) release(block int) { t.put(block) }

func (t *tcpTransport) queues() int       { return t.n }
func (t *tcpTransport) resume(gen uint64) { t.c.ResumeIO(gen) }
func (t *tcpTransport) maxIOSize() int    { return t.c.Params().MaxIOSize }
func (t *tcpTransport) close() error      { return t.c.Close() }

// completionQueues: TCP queues are woken by their sockets, not by CQs.
func (t *tcpTransport) completionQueues() []CompletionQueue { return nil }

func (t *tcpTransport) call(ctx context.Context, write bool, usr []byte, respLen int) (int, []byte, error) {
	var data []byte
	if respLen > 0 {
		data = make([]byte, respLen)
	}
	done := make(chan int, 1)
	r := &tcp.Request{Write: write, Usr: usr, Data: data, Done: func(_ *tcp.Request, e int) { done <- e }}
	t.c.Admin().Do(func(q *tcp.ClientQueue) {
		if err := q.Submit(r); err != nil {
			done <- -int(syscall.EINVAL)
		}
	})
	select {
	case e := <-done:
		return e, data, nil
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
}

func (t *tcpTransport) paths() []PathStatus {
	var out []PathStatus
	for _, p := range t.c.Paths() {
		out = append(out, PathStatus{Index: p.Index, Addr: p.Addr.String(), State: p.State, RTT: p.RTT, LastError: p.LastError, Stats: p.Stats})
	}
	return out
}

func (t *tcpTransport) pathManager() pathManager { return t.c }

type tcpQueue struct {
	q    *tcp.ClientQueue
	reqs []tcp.Request
	done func(tag uint16, errno int)
}

func (t *tcpTransport) queue(block, i, tid int, ring *uring.Ring, base uint64, depth int, done func(uint16, int)) transportQueue {
	tq := &tcpQueue{q: t.c.Queue(block*t.n + i), reqs: make([]tcp.Request, depth), done: done}
	for j := range tq.reqs {
		tq.reqs[j].Tag = uint64(j)
		tq.reqs[j].Done = tq.onDone
	}
	tq.q.Attach(ring, base)
	return tq
}

func (tq *tcpQueue) submit(tag uint16, write bool, usr, data []byte) error {
	r := &tq.reqs[tag]
	r.Write, r.Usr, r.Data = write, usr, data
	return tq.q.Submit(r)
}

func (tq *tcpQueue) onDone(r *tcp.Request, errno int) { tq.done(uint16(r.Tag), errno) }
func (tq *tcpQueue) handleCQE(cqe *uring.CQE)         { tq.q.HandleCQE(cqe) }
func (tq *tcpQueue) flush()                           { tq.q.Flush() }

func (tq *tcpQueue) detach()      { tq.q.Detach() }
func (tq *tcpQueue) do(fn func()) { tq.q.Do(func(*tcp.ClientQueue) { fn() }) }
