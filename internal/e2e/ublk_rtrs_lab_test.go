package e2e

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/ublk"
	"github.com/urnbd/urnbd/uring"
)

// memServer serves RTRS requests from memory; the user message is the
// request's 8-byte byte offset.
type memServer struct {
	mu  sync.Mutex
	mem []byte
}

func (m *memServer) HandleIO(io *tcp.ServerIO) {
	off := binary.LittleEndian.Uint64(io.Usr)
	m.mu.Lock()
	if io.Write {
		copy(m.mem[off:], io.Data)
	} else {
		copy(io.Data, m.mem[off:])
	}
	m.mu.Unlock()
	io.Complete(0)
}

// rtrsTarget is a ublk target whose queues forward every request to the
// RTRS client queue of the same index, on the ublk queue's own thread and
// io_uring: the shape of urnbd's RNBD client.
type rtrsTarget struct{ c *tcp.Client }

type rtrsQueue struct {
	uq   *ublk.Queue
	rq   *tcp.ClientQueue
	reqs []tcp.Request
	usr  [][8]byte
	cqe  uring.CQE
}

func (t rtrsTarget) NewQueue(q *ublk.Queue) (ublk.QueueHandler, error) {
	h := &rtrsQueue{uq: q, rq: t.c.Queue(int(q.ID())), reqs: make([]tcp.Request, q.Depth()), usr: make([][8]byte, q.Depth())}
	for i := range h.reqs {
		h.reqs[i].Tag = uint64(i)
		h.reqs[i].Done = h.done
	}
	h.rq.Attach(q.Ring(), ublk.TargetUserData(0))
	return h, nil
}

func (h *rtrsQueue) Handle(tag uint16, req *ublk.Request) {
	if req.Op != ublk.OpRead && req.Op != ublk.OpWrite {
		h.uq.Complete(tag, 0) // memory has no cache to flush, nothing to discard
		return
	}
	r := &h.reqs[tag]
	binary.LittleEndian.PutUint64(h.usr[tag][:], uint64(req.Offset()))
	r.Write, r.Usr, r.Data = req.Op == ublk.OpWrite, h.usr[tag][:], req.Buf
	if err := h.rq.Submit(r); err != nil {
		h.uq.Complete(tag, -5)
	}
}

func (h *rtrsQueue) done(r *tcp.Request, errno int) {
	res := int32(errno)
	if errno == 0 {
		res = int32(len(r.Data))
	}
	h.uq.Complete(uint16(r.Tag), res)
}

func (h *rtrsQueue) OnCompletion(ud uint64, res int32, flags uint32) {
	h.cqe = uring.CQE{UserData: ud, Res: res, Flags: flags}
	h.rq.HandleCQE(&h.cqe)
}

func (h *rtrsQueue) Flush()       { h.rq.Flush() }
func (h *rtrsQueue) Close() error { return nil }

// A ublk device served over RTRS (TCP, loopback inside the VM) by a memory
// server: fio verify passes, each ublk queue driving its own RTRS queue.
func TestLabUblkOverRTRS(t *testing.T) {
	labtest.NeedUblk(t)
	const size = 256 << 20
	srv, err := tcp.NewServer(tcp.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 256}, Handler: &memServer{mem: make([]byte, size)}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tcp.DialClient(ctx, tcp.ClientConfig{SessName: "e2e", Paths: []tcp.PathAddr{{Dst: ln.Addr().String()}},
		Queues: 2, Policy: rtrs.MinInflight, MaxReconnectAttempts: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctrl := openControl(t)
	dev, err := ublk.Create(ctrl, ublk.Options{ID: -1, Size: size, Queues: 2, Depth: 64,
		MaxIOBytes: c.Params().MaxIOSize &^ 4095}, rtrsTarget{c})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Delete()
	res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(ublk.BlockPath(dev.ID()), "96M")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify over RTRS: %v, %d job errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	st := c.Paths()[0].Stats.Snapshot()
	t.Logf("fio verify over ublk+RTRS/TCP: %d I/Os, 0 errors; path stats/rdma: %s", res.IOs(), c.Paths()[0].Stats.AppendRdma(nil))
	if st.Read.Count == 0 || st.Write.Count == 0 {
		t.Errorf("the RTRS path counted no reads or writes: %+v", st)
	}
}
