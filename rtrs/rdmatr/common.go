package rdmatr

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/uring"
)

// Params are the session parameters a server announced in its ConnRsp.
type Params = rtrs.Params

// recvSlot is the size of one receive buffer: room for the SEND payloads
// that may come after INFO: an RKEY_RSP (server→client, with
// FlagNewRkey) and a FenceReq (client→server on cid 0, with FlagFence).
// A connection's receives are taken in order by whatever comes next, so
// each must hold the largest.
const recvSlot = 32

var _ [recvSlot - max(rtrs.RkeyRspSize, rtrs.FenceReqSize)]struct{} // recvSlot holds both

// conn is one RC connection: a CM id with its own completion channel, CQ
// and QP, and a registered buffer of receive slots.
type conn struct {
	id    *rdma.CMID
	cid   uint16
	cc    *rdma.CompChannel
	cq    *rdma.CQ
	qp    *rdma.QP
	nrecv int
	rbuf  []byte // nrecv slots of recvSlot bytes (plus extra room, see newConn)
	rmr   *rdma.MR
	// readEvents: a loop's wait for the channel reads the event itself
	// (armWait); event is where that READ puts it, and eventDue says the
	// last wait ended on an event that the next wait is to read.
	readEvents bool
	eventDue   bool
	event      uint64
}

// newConn creates the verbs resources of a connection on id in pd: a CQ
// for sendWR+recvWR completions on its own channel, the QP, and a receive
// buffer of recvWR slots followed by extra bytes (for INFO messages).
//
// With signalAll every send work request makes a completion; otherwise
// only those posted with rdma.SendSignaled do (see signalInterval).
func newConn(id *rdma.CMID, pd *rdma.PD, cid uint16, sendWR, recvWR, extra int, signalAll bool) (_ *conn, err error) {
	c := &conn{id: id, cid: cid, nrecv: recvWR}
	defer func() {
		if err != nil {
			c.destroy(false)
		}
	}()
	ctx := id.Context()
	if ctx.IsZero() {
		return nil, errors.New("rtrs/rdmatr: connection id has no device")
	}
	if attr, err := ctx.QueryDevice(); err == nil && attr.MaxQPWR > 0 {
		sendWR, recvWR = min(sendWR, attr.MaxQPWR), min(recvWR, attr.MaxQPWR)
		c.nrecv = recvWR
	}
	if c.cc, err = ctx.NewCompChannel(); err != nil {
		return nil, err
	}
	if err = c.cc.SetNonblock(true); err != nil {
		return nil, err
	}
	if c.cq, err = ctx.NewCQ(sendWR+recvWR, c.cc, 0); err != nil {
		return nil, err
	}
	if c.qp, err = id.CreateQP(pd, rdma.QPAttr{SendCQ: c.cq, RecvCQ: c.cq, SignalAll: signalAll,
		Cap: rdma.QPCap{MaxSendWR: uint32(sendWR), MaxRecvWR: uint32(recvWR), MaxSendSGE: 2, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	size := (recvWR*recvSlot + extra + 4095) &^ 4095
	if c.rbuf, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr: mmap receive buffers: %w", err)
	}
	if c.rmr, err = pd.RegMR(c.rbuf, rdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	if err = c.cq.ReqNotify(false); err != nil {
		return nil, err
	}
	c.readEvents = c.cc.ReadableEvents()
	return c, nil
}

// signalInterval says how often IO connections post a send signaled: only
// every n-th request (client) or answer (server), as the kernel's RTRS does
// with its signal_interval, since a completion for every send would wake
// the peer's poller once for the ACK of each request and once more for its
// answer. The unsignaled ones in between are retired by the next signaled
// one, so the send queue must hold a queue depth of requests (two work
// requests each, on the server) plus n more: n is at most 16 and half the
// queue depth. Errors make a completion whether signaled or not.
func signalInterval(queueDepth int) int { return max(1, min(16, queueDepth/2)) }

// recvSGE returns the SGE of receive slot i.
func (c *conn) recvSGE(i int) rdma.SGE { return c.rmr.SGE(i*recvSlot, recvSlot) }

// extraOff is where the extra bytes start in rbuf.
func (c *conn) extraOff() int { return c.nrecv * recvSlot }

// postRecvs posts receives into slots [from, to).
func (c *conn) postRecvs(from, to int) error {
	b := rdma.NewRecvBatch(64, 1)
	defer b.Free()
	for i := from; i < to; i++ {
		if err := b.Add(uint64(i), c.recvSGE(i)); err != nil {
			return err
		}
		if b.Len() == b.Cap() {
			if _, err := b.Post(c.qp); err != nil {
				return err
			}
		}
	}
	if b.Len() > 0 {
		_, err := b.Post(c.qp)
		return err
	}
	return nil
}

// destroy frees the connection's resources (disconnecting first if asked).
func (c *conn) destroy(disconnect bool) {
	if c == nil {
		return
	}
	if c.id != nil {
		if disconnect {
			c.id.Disconnect()
		}
		c.id.Destroy() // and its QP
		c.id = nil
	}
	if c.rmr != nil {
		c.rmr.Dereg()
		c.rmr = nil
	}
	if c.rbuf != nil {
		unix.Munmap(c.rbuf)
		c.rbuf = nil
	}
	if c.cq != nil {
		c.cq.Destroy()
		c.cq = nil
	}
	if c.cc != nil {
		c.cc.Close()
		c.cc = nil
	}
}

// drainEvents takes the pending completion event of the connection's
// channel, acknowledges it and re-arms the CQ; then poll it empty. The
// channel serves only this CQ, and an armed CQ raises one event until it
// is armed again, so there is at most one event to take: reading until
// EAGAIN would cost a second read(2) on every wake-up.
func (c *conn) drainEvents() error {
	if _, err := c.takeEvent(); err != nil {
		return err
	}
	return c.cq.ReqNotify(false)
}

// armWait prepares in ring the wait of an event loop for the connection's
// next completion event: a POLL_ADD of its channel with user data ud. Give
// the result of that entry to endWait; then, to go on with the connection,
// call rearm, poll the CQ empty and arm the next wait.
//
// Where the channel's events are readable (rdma.CompChannel.ReadableEvents)
// the event that ended the previous wait is taken here too, without a
// read(2): a READ of it (user data readUD) goes before the POLL_ADD, with
// IOSQE_CQE_SKIP_SUCCESS. It runs inline in the io_uring_enter that submits
// the wait, since the event is there: the last wait found the channel
// readable, and only this READ takes its events. (Of an empty channel
// io_uring would wait for the next event, as for any O_NONBLOCK file, and
// the POLL_ADD behind it could miss that event.) It makes a completion
// only if it fails (give that to readFailed): the wake-up costs that one
// io_uring_enter. A READ linked behind the POLL_ADD instead came as deferred
// task work after the POLL_ADD's completion, which alone satisfied the wait:
// the loop entered again for the READ's (and on Linux 7.3 such a chain with
// IOSQE_CQE_SKIP_SUCCESS on the POLL_ADD never completed the READ).
func (c *conn) armWait(ring *uring.Ring, readUD, ud uint64) error {
	fd := int32(c.cc.Fd())
	if !c.eventDue {
		s, err := ring.NextSQE()
		if err != nil {
			return err
		}
		s.PrepPollAdd(fd, unix.POLLIN, false, ud)
		return nil
	}
	if err := ring.Reserve(2); err != nil {
		return err // the READ and the POLL_ADD after it go in one submission
	}
	c.eventDue = false
	c.event = 0
	r := ring.GetSQE()
	r.PrepRead(fd, unsafe.Pointer(&c.event), rdma.EventSize, ^uint64(0), readUD)
	r.Flags |= uring.SQECQESkipSuccess
	ring.GetSQE().PrepPollAdd(fd, unix.POLLIN, false, ud)
	return nil
}

// endWait ends a wait of armWait whose POLL_ADD completed with res. The
// event that the wait's READ took, which ran before the POLL_ADD could
// complete, is acknowledged; an event that ended this wait is read by the
// next one. Call it for every wait that ends, also one of a connection
// going away, or destroying the CQ waits for the event forever.
func (c *conn) endWait(res int32) error {
	if !c.readEvents {
		return nil // the event, if any, is still in the channel: see rearm
	}
	var err error
	if ev := c.event; ev != 0 {
		c.event = 0
		err = c.cq.AckRead(ev)
	}
	switch {
	case res > 0 && res&unix.POLLIN != 0:
		c.eventDue = true
	case res > 0:
		return fmt.Errorf("rtrs/rdmatr: completion channel: poll events %#x: %w", res, unix.EIO)
	case res < 0 && res != -int32(unix.ECANCELED):
		return fmt.Errorf("rtrs/rdmatr: poll completion channel: %w", unix.Errno(-res))
	}
	return err
}

// readFailed handles the completion of a wait's READ, which comes only when
// it failed with errno -res: an error, unless the ring went away first
// (ECANCELED).
func (c *conn) readFailed(res int32) error {
	if res == -int32(unix.ECANCELED) {
		return nil
	}
	if res < 0 {
		return fmt.Errorf("rtrs/rdmatr: read completion event: %w", unix.Errno(-res))
	}
	return fmt.Errorf("rtrs/rdmatr: read completion event: %d bytes: %w", res, unix.EIO)
}

// dropWait is endWait for a wait whose ring went away before its
// completion was reaped: an event its READ took is acknowledged, and an
// event left in the channel is taken by the next wait's READ (the new
// ring's POLL_ADD finds the channel readable).
func (c *conn) dropWait() {
	c.eventDue = false
	if c.readEvents && c.event != 0 {
		ev := c.event
		c.event = 0
		c.cq.AckRead(ev) // an error: not this CQ's event, nothing to acknowledge
	}
}

// rearm re-arms the CQ after a wait ended (endWait), first taking the
// channel's event where the wait did not read it.
func (c *conn) rearm() error {
	if c.readEvents {
		return c.cq.ReqNotify(false)
	}
	return c.drainEvents()
}

// takeEvent takes and acknowledges the channel's pending event, if there
// is one (the channel is non-blocking); it reports whether there was.
func (c *conn) takeEvent() (bool, error) { return c.cc.TakeEvent(c.cq) }

// netpollFd watches a non-blocking fd through Go's netpoller, on a dup of
// it: a goroutine waiting on it parks without holding a thread or a P. A
// goroutine blocked in poll(2) instead holds its P in a system call, which
// sysmon retakes after 10ms and then polls every 20µs again; with the
// service, CM and server loops waiting 10-100ms at a time, sysmon never
// backed off.
type netpollFd struct {
	f    *os.File
	rc   syscall.RawConn
	read func(uintptr) bool // try, as RawConn.Read wants it: made once, not per wait
}

// newNetpollFd registers a dup of fd (made non-blocking, as is the fd:
// they share the flag) with the netpoller; wait calls try.
func newNetpollFd(fd int, try func() bool) (*netpollFd, error) {
	nfd, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return nil, err
	}
	f := os.NewFile(uintptr(nfd), "rdma-event-fd")
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, err // not pollable
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &netpollFd{f: f, rc: rc, read: func(uintptr) bool { return try() }}, nil
}

// wait calls try until it returns true, parking while the fd is not
// readable. It returns os.ErrDeadlineExceeded once the deadline set with
// f.SetReadDeadline passes. It does not allocate.
func (w *netpollFd) wait() error { return w.rc.Read(w.read) }

func (w *netpollFd) close() { w.f.Close() }

// waitFd waits until fd is readable or d passes; it reports readability.
// It waits in the netpoller (netpollFd), or in poll(2) if fd cannot be
// polled that way.
func waitFd(fd int, d time.Duration) bool {
	if readable(fd) {
		return true
	}
	if d <= 0 {
		return false
	}
	if w, err := newNetpollFd(fd, func() bool { return readable(fd) }); err == nil {
		defer w.close()
		if w.f.SetReadDeadline(time.Now().Add(d)) == nil {
			return w.wait() == nil
		}
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, max(int(d/time.Millisecond), 0))
	return err == nil && n > 0
}

func readable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// waitCM waits for the next CM event on ch (non-blocking channel) within d
// and acknowledges it.
func waitCM(ch *rdma.EventChannel, d time.Duration) (*rdma.Event, error) {
	deadline := time.Now().Add(d)
	for {
		ev, err := ch.GetEvent()
		if err == nil {
			ev.Ack()
			return ev, nil
		}
		if !errors.Is(err, unix.EAGAIN) {
			return nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("rtrs/rdmatr: no CM event within %v: %w", d, unix.ETIMEDOUT)
		}
		waitFd(ch.Fd(), min(left, 100*time.Millisecond))
	}
}

// expectCM waits for an event of type want on ch.
func expectCM(ch *rdma.EventChannel, want rdma.EventType, d time.Duration) (*rdma.Event, error) {
	ev, err := waitCM(ch, d)
	if err != nil {
		return nil, err
	}
	if ev.Type != want {
		return ev, fmt.Errorf("rtrs/rdmatr: CM event %v (status %d), want %v: %w", ev.Type, ev.Status, want, unix.ECONNRESET)
	}
	return ev, nil
}

// mmapRegion maps n bytes of anonymous memory (rounded up to pages).
func mmapRegion(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, (n+4095)&^4095, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr: mmap %d bytes: %w", n, err)
	}
	return b[:n], nil
}

func munmap(b []byte) {
	if cap(b) > 0 {
		unix.Munmap(b[:cap(b)])
	}
}

// parseAddr parses "ip:port" (port default rtrs.DefaultPort) or "ip".
func parseAddr(s string, defPort uint16) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("rtrs/rdmatr: address %q: %w", s, err)
	}
	return netip.AddrPortFrom(a, defPort), nil
}
