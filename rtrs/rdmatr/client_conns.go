package rdmatr

import (
	"sync/atomic"
	"time"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/session"
)

// pathConns are the connections and registrations of one connect of a
// path (session.Conn); a reconnect makes new ones.
type pathConns struct {
	c      *Client
	p      *session.Path
	gen    uint64 // the connect's number (Attach)
	ch     *rdma.EventChannel
	pd     *rdma.PD
	svc    *conn
	io     []*conn // by queue
	params Params
	chunks []rtrs.RemoteChunk
	partMR []*rdma.MR // by region part; set under Client.mu, read by queues once the part is registered
	hdrMR  *rdma.MR
	info   []byte
	infoMR *rdma.MR
	failed atomic.Bool
	// claims[i] is set while queue i holds, or may still take, its
	// connection of this set; holders counts the set claims, and released
	// is closed when the last one goes (pathConns.release).
	claims   []atomic.Bool
	holders  atomic.Int32
	released chan struct{}
	attached bool
	cqs      []CQInfo // the CQs' handles (CompletionQueues)
}

// Params implements session.Conn.
func (pc *pathConns) Params() Params { return pc.params }

// Attach implements session.Conn: it registers the client's memory with
// the path's device and hands the IO connections to the queues; each
// queue claims its connection until it releases it.
func (pc *pathConns) Attach(gen uint64) (err error) {
	c := pc.c
	if err := c.registerParts(pc); err != nil {
		return err
	}
	if pc.hdrMR, err = pc.pd.RegMR(c.hdr[:cap(c.hdr)], rdma.AccessLocalWrite); err != nil {
		return err
	}
	qs := c.queues
	pc.gen, pc.attached = gen, true
	pc.cqs = pc.cqInfos()
	c.live[pc.p.Index()].Store(pc)
	pc.claims = make([]atomic.Bool, len(qs))
	pc.released = make(chan struct{})
	pc.holders.Store(int32(len(qs)))
	for i, q := range qs {
		pc.claims[i].Store(true)
		q.core.PostAttach(attachMsg{pc: pc, cn: pc.io[i]})
	}
	return nil
}

// release gives up queue qid's claim on the set, once; the last release
// lets Close free it.
func (pc *pathConns) release(qid int) {
	if pc.claims[qid].Swap(false) && pc.holders.Add(-1) == 0 {
		close(pc.released)
	}
}

// fail is called (from any thread) when a connection of the set failed.
func (pc *pathConns) fail(why string, args ...any) {
	pc.failed.Store(true)
	pc.p.Failed(pc.gen, why, args...)
}

// Close implements session.Conn: it disconnects the set, takes it from
// the queues (their requests fail over) and frees it once no queue polls
// its CQs.
func (pc *pathConns) Close() {
	if !pc.attached {
		pc.destroy()
		return
	}
	c := pc.c
	c.live[pc.p.Index()].CompareAndSwap(pc, nil)
	pc.failed.Store(true)
	pc.svc.id.Disconnect()
	for _, cn := range pc.io {
		cn.id.Disconnect()
	}
	qs := c.queues
	for _, q := range qs {
		q.core.PostDetach(pc.p, pc.gen)
	}
	// A queue that no event loop drives (RNBD keeps queues for devices
	// not mapped yet, and for devices unmapped: Detach) cannot release:
	// it has not even taken its connection, or no loop reads its mailbox.
	// When it is driven again it finds the set failed and leaves it
	// without touching it (attachConn and Attach check failed, set above,
	// after driven is set). So its claim is dropped here. failed is
	// stored before driven is loaded, and Attach and Detach store driven
	// before they load failed: a queue that Close does not see undriven
	// sees the set failed.
	for _, q := range qs {
		if !q.driven.Load() {
			pc.release(q.core.ID)
		}
	}
	timeout := c.s.Config().Timeout
	select {
	case <-pc.released:
	case <-time.After(timeout):
		// A queue whose loop stopped still holds it: leak rather than
		// free it under the queue.
		c.s.Logf("rtrs/rdmatr client path %v: %d queue(s) did not release their connections within %v; leaking them", pc.p.Addr(), pc.holders.Load(), timeout)
		return
	}
	pc.destroy()
}

func (pc *pathConns) destroy() {
	pc.svc.destroy(false)
	pc.svc = nil
	for _, cn := range pc.io {
		cn.destroy(false)
	}
	pc.io = nil
	pc.c.forgetParts(pc)
	for _, mr := range append(pc.partMR, pc.hdrMR, pc.infoMR) {
		if mr != nil {
			mr.Dereg()
		}
	}
	pc.partMR, pc.hdrMR, pc.infoMR = nil, nil, nil
	munmap(pc.info)
	pc.info = nil
	if pc.pd != nil {
		pc.pd.Dealloc()
		pc.pd = nil
	}
	if pc.ch != nil {
		// Ids are gone; drain what is left so Close does not block.
		for {
			ev, err := pc.ch.GetEvent()
			if err != nil {
				break
			}
			ev.Ack()
		}
		pc.ch.Close()
		pc.ch = nil
	}
	// If the device went away, librdmacm closes it only now that nothing
	// of ours is on it, and only if told to look: without this the
	// kernel's removal of the device (rdma link delete) waits for us.
	_ = rdma.ForgetRemovedDevices()
}
