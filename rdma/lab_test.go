package rdma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/uring"
)

// Lab tests: real soft-RoCE (rxe) over the lab's path 1, 192.0.2.1 (rxe0,
// veth0) <-> 192.0.2.2 (rxe1, veth1). They run in tools/lab with
// URNBD_LAB=1, and skip on hosts without RDMA.

var (
	clientIP = netip.MustParseAddr("192.0.2.1")
	serverIP = netip.MustParseAddr("192.0.2.2")
)

const (
	labTimeout = 20 * time.Second
	bufSize    = 1 << 20
	slot       = 4096 // bytes per work request in the data tests
	pdLen      = 56   // private data of a connect request in the TCP port space
)

var provisionOnce sync.Once

// needLab provisions soft-RoCE in the lab (idempotent) and requires the
// RDMA CM device.
func needLab(t testing.TB) {
	t.Helper()
	if labtest.InLab() {
		provisionOnce.Do(func() {
			labtest.Run(t, "../tools/lab/provision.sh", "modules")
			labtest.Run(t, "../tools/lab/provision.sh", "rdma")
		})
	}
	labtest.Need(t, "/dev/infiniband/rdma_cm", "rdma_ucm")
}

// waitEvent waits (poll(2) on the non-blocking channel fd) for the next CM
// event, acknowledges it and checks its type.
func waitEvent(t testing.TB, ch *EventChannel, want EventType) *Event {
	t.Helper()
	deadline := time.Now().Add(labTimeout)
	for {
		ev, err := ch.GetEvent()
		if err == nil {
			if err := ev.Ack(); err != nil {
				t.Fatal(err)
			}
			if ev.Type != want {
				t.Fatalf("event %v (status %d), want %v", ev.Type, ev.Status, want)
			}
			return ev
		}
		if !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("GetEvent: %v", err)
		}
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			t.Fatalf("no %v within %v", want, labTimeout)
		}
		fds := []unix.PollFd{{Fd: int32(ch.Fd()), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatalf("poll: %v", err)
		}
	}
}

func newChannel(t testing.TB) *EventChannel {
	t.Helper()
	ch, err := NewEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.SetNonblock(true); err != nil {
		t.Fatal(err)
	}
	return ch
}

// end is one side of a connection: an id with its verbs resources and a
// registered, mmap'd buffer.
type end struct {
	id  *CMID
	pd  *PD
	cc  *CompChannel
	cq  *CQ
	qp  *QP
	buf []byte
	mr  *MR
	wcs []WC
}

func newEnd(t testing.TB, id *CMID) *end {
	t.Helper()
	ctx := id.Context()
	if ctx.IsZero() {
		t.Fatal("id has no device")
	}
	e := &end{id: id, wcs: make([]WC, 64)}
	var err error
	if e.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cc, err = ctx.NewCompChannel(); err != nil {
		t.Fatal(err)
	}
	if err := e.cc.SetNonblock(true); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = ctx.NewCQ(256, e.cc, 0); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = id.CreateQP(e.pd, QPAttr{SendCQ: e.cq, RecvCQ: e.cq,
		Cap: QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}}); err != nil {
		t.Fatal(err)
	}
	if e.buf, err = unix.Mmap(-1, 0, bufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = e.pd.RegMR(e.buf, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return e
}

// close tears the end down in the order rdma-core wants.
func (e *end) close(t testing.TB) {
	t.Helper()
	if err := e.id.Destroy(); err != nil { // and its QP
		t.Error(err)
	}
	if err := e.mr.Dereg(); err != nil {
		t.Error(err)
	}
	if err := unix.Munmap(e.buf); err != nil {
		t.Error(err)
	}
	if err := e.cq.Destroy(); err != nil {
		t.Error(err)
	}
	if err := e.cc.Close(); err != nil {
		t.Error(err)
	}
	if err := e.pd.Dealloc(); err != nil {
		t.Error(err)
	}
}

// pollN polls e's CQ in batches until n completions arrived; they are in
// e.wcs[:n]. It does not allocate unless it fails.
func (e *end) pollN(t testing.TB, n int) []WC {
	got := 0
	deadline := time.Now().Add(labTimeout)
	for got < n {
		k, err := e.cq.Poll(e.wcs[got:n])
		if err != nil {
			t.Fatal(err)
		}
		got += k
		if k == 0 && time.Now().After(deadline) {
			t.Fatalf("%d of %d completions within %v", got, n, labTimeout)
		}
	}
	for i := range e.wcs[:n] {
		if w := &e.wcs[i]; w.Status != WCSuccess {
			t.Fatalf("completion %d (wr %d, %v): %v (vendor error %#x)", i, w.WRID, w.Opcode, w.Status, w.VendorErr)
		}
	}
	return e.wcs[:n]
}

// privData is the 56 bytes of private data a side sends: its buffer's
// address and rkey, then a pattern.
func privData(e *end, seed byte) []byte {
	pd := make([]byte, pdLen)
	binary.LittleEndian.PutUint64(pd, e.mr.Addr())
	binary.LittleEndian.PutUint32(pd[8:], e.mr.RKey())
	for i := 12; i < pdLen; i++ {
		pd[i] = seed + byte(i)
	}
	return pd
}

// pair is a connected client and server.
type pair struct {
	sch, cch       *EventChannel
	listen         *CMID
	client, server *end
	// The peer's buffer, from the private data.
	serverAddr, clientAddr uint64
	serverRKey, clientRKey uint32
}

func listen(t testing.TB, ch *EventChannel) *CMID {
	t.Helper()
	l, err := ch.NewID(PSTCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Bind(netip.AddrPortFrom(serverIP, 0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Listen(8); err != nil {
		t.Fatal(err)
	}
	if l.LocalAddr().Addr() != serverIP || l.LocalAddr().Port() == 0 {
		t.Fatalf("listening on %v", l.LocalAddr())
	}
	return l
}

// dial resolves and connects a new client id to l, returning its end
// once Connect is called.
func dial(t testing.TB, cch *EventChannel, l *CMID, pdSeed byte) (*end, []byte) {
	t.Helper()
	id, err := cch.NewID(PSTCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveAddr(netip.AddrPortFrom(clientIP, 0), l.LocalAddr(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, cch, EventAddrResolved)
	if err := id.ResolveRoute(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, cch, EventRouteResolved)
	c := newEnd(t, id)
	pd := privData(c, pdSeed)
	if err := id.Connect(ConnParam{PrivateData: pd, ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	return c, pd
}

func connect(t testing.TB) *pair {
	t.Helper()
	needLab(t)
	p := &pair{sch: newChannel(t), cch: newChannel(t)}
	p.listen = listen(t, p.sch)

	var cpd []byte
	p.client, cpd = dial(t, p.cch, p.listen, 1)

	req := waitEvent(t, p.sch, EventConnectRequest)
	if req.ListenID != p.listen || req.ID == nil || req.ID == p.listen {
		t.Fatalf("connect request ids: %p listen %p (listener %p)", req.ID, req.ListenID, p.listen)
	}
	if len(req.PrivateData) < pdLen || !bytes.Equal(req.PrivateData[:pdLen], cpd) {
		t.Fatalf("server got private data % x, want % x", req.PrivateData, cpd)
	}
	p.clientAddr = binary.LittleEndian.Uint64(req.PrivateData)
	p.clientRKey = binary.LittleEndian.Uint32(req.PrivateData[8:])
	p.server = newEnd(t, req.ID)
	spd := privData(p.server, 100)
	if err := req.ID.Accept(ConnParam{PrivateData: spd, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	est := waitEvent(t, p.cch, EventEstablished)
	if len(est.PrivateData) < pdLen || !bytes.Equal(est.PrivateData[:pdLen], spd) {
		t.Fatalf("client got private data % x, want % x", est.PrivateData, spd)
	}
	p.serverAddr = binary.LittleEndian.Uint64(est.PrivateData)
	p.serverRKey = binary.LittleEndian.Uint32(est.PrivateData[8:])
	if ev := waitEvent(t, p.sch, EventEstablished); ev.ID != p.server.id {
		t.Fatalf("established on %p, want %p", ev.ID, p.server.id)
	}
	return p
}

// close disconnects from the client side and checks both sides see
// it, then frees everything.
func (p *pair) close(t testing.TB) {
	t.Helper()
	if err := p.client.id.Disconnect(); err != nil {
		t.Fatal(err)
	}
	// The passive side sees the DREQ and answers with its own Disconnect
	// (the DREP); only then does the active side see its event.
	if ev := waitEvent(t, p.sch, EventDisconnected); ev.ID != p.server.id {
		t.Errorf("server disconnect event on %p", ev.ID)
	}
	if err := p.server.id.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, p.cch, EventDisconnected); ev.ID != p.client.id {
		t.Errorf("client disconnect event on %p", ev.ID)
	}
	p.client.close(t)
	p.server.close(t)
	if err := p.listen.Destroy(); err != nil {
		t.Error(err)
	}
	if err := p.cch.Close(); err != nil {
		t.Error(err)
	}
	if err := p.sch.Close(); err != nil {
		t.Error(err)
	}
}

func txPackets(t testing.TB, netdev string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/sys/class/net/" + netdev + "/statistics/tx_packets")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*31 + i*7 + i>>8)
	}
}

func TestLabConnection(t *testing.T) {
	p := connect(t)
	c, s := p.client, p.server

	// Addresses and devices of the connected ids.
	if a := c.id.LocalAddr(); a.Addr() != clientIP || a.Port() == 0 {
		t.Errorf("client local %v", a)
	}
	if a := c.id.PeerAddr(); a != p.listen.LocalAddr() {
		t.Errorf("client peer %v, want %v", a, p.listen.LocalAddr())
	}
	if a := s.id.LocalAddr(); a != p.listen.LocalAddr() {
		t.Errorf("server local %v", a)
	}
	if a := s.id.PeerAddr(); a != c.id.LocalAddr() {
		t.Errorf("server peer %v, want %v", a, c.id.LocalAddr())
	}
	if c.id.DeviceName() != "rxe0" || s.id.DeviceName() != "rxe1" || c.id.PortNum() != 1 || s.id.PortNum() != 1 {
		t.Errorf("devices: client %s/%d server %s/%d", c.id.DeviceName(), c.id.PortNum(), s.id.DeviceName(), s.id.PortNum())
	}
	if c.qp.Num() == 0 || c.qp.Cap().MaxSendWR < 64 || c.qp.Cap().MaxInlineData < 64 {
		t.Errorf("client qp %d cap %+v", c.qp.Num(), c.qp.Cap())
	}
	if attr, err := c.id.Context().QueryDevice(); err != nil || attr.MaxQPWR < 64 {
		t.Errorf("QueryDevice: %+v, %v", attr, err)
	}
	t.Logf("client %v on %s qp %d, server %v on %s qp %d", c.id.LocalAddr(), c.id.DeviceName(), c.qp.Num(),
		s.id.LocalAddr(), s.id.DeviceName(), s.qp.Num())

	sb := NewSendBatch(16, 2)
	defer sb.Free()
	rb := NewRecvBatch(16, 1)
	defer rb.Free()

	t.Run("WriteWithImm", func(t *testing.T) {
		// The traffic must cross the veth pair, not loop back through lo.
		tx0 := txPackets(t, "veth0")
		defer func() {
			if tx := txPackets(t, "veth0"); tx-tx0 < 16 {
				t.Errorf("veth0 sent %d packets for 16 RDMA WRITEs", tx-tx0)
			}
		}()
		// Client writes 16 slots of the server's buffer in one post; each
		// write's imm lands in a receive the server posted in one batch.
		for i := range 16 {
			if err := rb.Add(uint64(1000 + i)); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := rb.Post(s.qp); n != 16 || err != nil {
			t.Fatalf("post recv: %d, %v", n, err)
		}
		for i := range 16 {
			fill(c.buf[i*slot:(i+1)*slot], i)
			if err := sb.Add(SendWR{ID: uint64(i), Opcode: WRWriteWithImm, Flags: SendSignaled,
				Imm: 0xdead0000 + uint32(i), RemoteAddr: p.serverAddr + uint64(i*slot), RKey: p.serverRKey},
				c.mr.SGE(i*slot, slot)); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := sb.Post(c.qp); n != 16 || err != nil {
			t.Fatalf("post send: %d, %v", n, err)
		}
		for i, w := range c.pollN(t, 16) {
			if w.WRID != uint64(i) || w.Opcode != WCRDMAWrite || w.QPNum != c.qp.Num() {
				t.Errorf("client wc %d: %+v", i, w)
			}
		}
		seen := map[uint32]bool{}
		for i, w := range s.pollN(t, 16) {
			if w.Opcode != WCRecvRDMAWithImm || !w.HasImm() || w.WRID != uint64(1000+i) || w.QPNum != s.qp.Num() {
				t.Errorf("server wc %d: %+v", i, w)
			}
			seen[w.Imm] = true
		}
		for i := range 16 {
			if !seen[0xdead0000+uint32(i)] {
				t.Errorf("imm %#x not received", 0xdead0000+uint32(i))
			}
			if !bytes.Equal(s.buf[i*slot:(i+1)*slot], c.buf[i*slot:(i+1)*slot]) {
				t.Errorf("slot %d differs after RDMA WRITE", i)
			}
		}
	})

	t.Run("Write", func(t *testing.T) {
		// Server writes back into the client (plain WRITE, two SGEs).
		fill(s.buf[100*slot:102*slot], 77)
		if err := sb.Add(SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled,
			RemoteAddr: p.clientAddr + 200*slot, RKey: p.clientRKey}, s.mr.SGE(100*slot, slot)); err != nil {
			t.Fatal(err)
		}
		if err := sb.AddSGE(s.mr.SGE(101*slot, slot)); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Post(s.qp); err != nil {
			t.Fatal(err)
		}
		if w := s.pollN(t, 1)[0]; w.Opcode != WCRDMAWrite {
			t.Errorf("wc %+v", w)
		}
		if !bytes.Equal(c.buf[200*slot:202*slot], s.buf[100*slot:102*slot]) {
			t.Error("data differs after RDMA WRITE")
		}
	})

	// send sends n bytes with opcode op from `from` into a receive posted
	// on `to`, and checks data, length and imm.
	send := func(t *testing.T, from, to *end, op WROpcode, n int, imm uint32) {
		t.Helper()
		const src, dst = 120 * slot, 180 * slot
		clear(to.buf[dst : dst+slot])
		fill(from.buf[src:src+n], n)
		if err := rb.Add(42, to.mr.SGE(dst, slot)); err != nil {
			t.Fatal(err)
		}
		if _, err := rb.Post(to.qp); err != nil {
			t.Fatal(err)
		}
		if err := sb.Add(SendWR{ID: 7, Opcode: op, Flags: SendSignaled, Imm: imm}, from.mr.SGE(src, n)); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Post(from.qp); err != nil {
			t.Fatal(err)
		}
		if w := from.pollN(t, 1)[0]; w.Opcode != WCSend || w.WRID != 7 {
			t.Errorf("sender wc %+v", w)
		}
		w := to.pollN(t, 1)[0]
		if w.Opcode != WCRecv || w.WRID != 42 || int(w.ByteLen) != n {
			t.Errorf("receiver wc %+v", w)
		}
		if op == WRSendWithImm && (!w.HasImm() || w.Imm != imm) {
			t.Errorf("imm: flags %#x imm %#x, want %#x", w.Flags, w.Imm, imm)
		}
		if op == WRSend && w.HasImm() {
			t.Errorf("plain send has imm: %+v", w)
		}
		if !bytes.Equal(to.buf[dst:dst+n], from.buf[src:src+n]) {
			t.Error("received data differs")
		}
	}
	t.Run("SendWithImm", func(t *testing.T) {
		send(t, s, c, WRSendWithImm, 100, 0x01020304)
		send(t, c, s, WRSendWithImm, 2000, 0xfedcba98)
	})
	t.Run("Send", func(t *testing.T) {
		send(t, c, s, WRSend, 4096, 0)
		send(t, s, c, WRSend, 1, 0)
	})

	t.Run("CompletionChannel", func(t *testing.T) {
		fd := s.cc.Fd()
		ready := func(ms int) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, ms)
			for errors.Is(err, unix.EINTR) {
				// A signal (the Go runtime's preemption) cut the wait
				// short: wait again, the whole time (the checks below
				// only get longer waits).
				n, err = unix.Poll(fds, ms)
			}
			if err != nil {
				t.Fatal(err)
			}
			return n == 1 && fds[0].Revents&unix.POLLIN != 0
		}
		if _, err := s.cc.GetEvent(); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("GetEvent with nothing pending: %v", err)
		}
		if err := s.cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		if k, _ := s.cq.Poll(s.wcs); k != 0 || ready(0) {
			t.Fatalf("not idle: %d completions, fd ready %v", k, ready(0))
		}
		if err := rb.Add(9, s.mr.SGE(0, slot)); err != nil {
			t.Fatal(err)
		}
		if _, err := rb.Post(s.qp); err != nil {
			t.Fatal(err)
		}
		if err := sb.Add(SendWR{ID: 8, Opcode: WRSendWithImm, Flags: SendSignaled, Imm: 5}, c.mr.SGE(0, 64)); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Post(c.qp); err != nil {
			t.Fatal(err)
		}
		c.pollN(t, 1)
		if !ready(int(labTimeout.Milliseconds())) {
			t.Fatal("completion channel fd did not become readable")
		}
		cq, err := s.cc.GetEvent()
		if err != nil || cq != s.cq {
			t.Fatalf("GetEvent: %p, %v (want %p)", cq, err, s.cq)
		}
		// GetEvent found s.cq by the cq_handle of the kernel's event, which
		// is the user_handle given at creation: what UserHandle reports.
		if h := cq.UserHandle(); h == 0 || h%8 != 0 {
			t.Errorf("UserHandle %#x: not the address of a struct ibv_cq", h)
		}
		s.cq.Ack(1)
		if err := s.cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		if w := s.pollN(t, 1)[0]; w.WRID != 9 || w.Imm != 5 {
			t.Errorf("wc %+v", w)
		}
		if ready(0) {
			t.Error("fd still readable after the event was consumed")
		}
	})

	// An event loop's wait in io_uring as rtrs/rdmatr makes it where
	// ReadableEvents says it may: a POLL_ADD of the channel and, submitted
	// with the next wait, a READ of the event that ended this one
	// (IOSQE_CQE_SKIP_SUCCESS) just before the next POLL_ADD. The loops
	// rely on the READ running inline in the submission (the event is in
	// ev when Submit returns) and posting nothing. (They read only a
	// channel that the last wait found readable: of an empty one, io_uring
	// would wait for the event, as it does for any O_NONBLOCK file.) A
	// missed acknowledgement would hang the CQ's Destroy in p.close.
	t.Run("ReadEvent", func(t *testing.T) {
		if !s.cc.ReadableEvents() || !c.cc.ReadableEvents() {
			t.Fatalf("rxe's channels: ReadableEvents false")
		}
		runtime.LockOSThread() // a loop ring has one issuer
		defer runtime.UnlockOSThread()
		ring, err := uring.NewLoop(8)
		if err != nil {
			t.Fatal(err)
		}
		defer ring.Close()
		fd := int32(s.cc.Fd())
		var ev uint64
		submit := func(read, poll uint64) {
			if err := ring.Reserve(2); err != nil {
				t.Fatal(err)
			}
			if read != 0 {
				ev = 0
				r := ring.GetSQE()
				r.PrepRead(fd, unsafe.Pointer(&ev), EventSize, ^uint64(0), read)
				r.Flags |= uring.SQECQESkipSuccess
			}
			if poll != 0 {
				ring.GetSQE().PrepPollAdd(fd, unix.POLLIN, false, poll)
			}
			if _, err := ring.Submit(); err != nil {
				t.Fatal(err)
			}
		}
		next := func(what string) uring.CQE {
			t.Helper()
			cqe, err := ring.WaitCQETimeout(labTimeout)
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			got := *cqe
			ring.CQESeen()
			return got
		}
		message := func(imm uint32) {
			if err := rb.Add(10, s.mr.SGE(0, slot)); err != nil {
				t.Fatal(err)
			}
			if _, err := rb.Post(s.qp); err != nil {
				t.Fatal(err)
			}
			if err := sb.Add(SendWR{ID: 8, Opcode: WRSendWithImm, Flags: SendSignaled, Imm: imm}, c.mr.SGE(0, 64)); err != nil {
				t.Fatal(err)
			}
			if _, err := sb.Post(c.qp); err != nil {
				t.Fatal(err)
			}
			c.pollN(t, 1)
		}
		// ended takes the wait's completion (ud), then re-arms and polls
		// the CQ as the loops do, before the event is read.
		ended := func(ud uint64, imm uint32) {
			t.Helper()
			if cqe := next("the wait's end"); cqe.UserData != ud || cqe.Res&unix.POLLIN == 0 {
				t.Fatalf("wait ended with %+v, want the POLL_ADD (%d) readable", cqe, ud)
			}
			if err := s.cq.ReqNotify(false); err != nil {
				t.Fatal(err)
			}
			if w := s.pollN(t, 1)[0]; w.WRID != 10 || w.Imm != imm {
				t.Errorf("wc %+v, want receive 10 with immediate %d", w, imm)
			}
		}
		// took checks that the READ ran in the submission and posted
		// nothing, and acknowledges the event.
		took := func() {
			t.Helper()
			if ev != s.cq.UserHandle() {
				t.Fatalf("after the submission the READ holds %#x, want the CQ's user handle %#x", ev, s.cq.UserHandle())
			}
			if cqe := ring.PeekCQE(); cqe != nil {
				t.Fatalf("the READ or the wait completed: %+v, want nothing", *cqe)
			}
			if err := s.cq.AckRead(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		if k, _ := s.cq.Poll(s.wcs); k != 0 {
			t.Fatalf("not idle: %d completions", k)
		}
		submit(0, 1)
		message(6)
		ended(1, 6)
		submit(2, 3)
		took()
		if err := s.cq.AckRead(s.cq.UserHandle() + 8); !errors.Is(err, unix.EINVAL) {
			t.Errorf("AckRead of another CQ's event: %v, want EINVAL", err)
		}
		message(7) // the CQ was re-armed before the READ: the wait ends
		ended(3, 7)
		submit(4, 5)
		took()
		// Removing the POLL_ADD ends the wait.
		ring.GetSQE().PrepPollRemove(5, 7)
		if _, err := ring.Submit(); err != nil {
			t.Fatal(err)
		}
		res := map[uint64]int32{}
		for len(res) < 2 {
			cqe := next("the removed wait")
			res[cqe.UserData] = cqe.Res
		}
		if res[5] != -int32(unix.ECANCELED) || res[7] != 0 {
			t.Errorf("removed wait: poll %d, remove %d; want the poll cancelled", res[5], res[7])
		}
	})

	t.Run("NoAllocs", func(t *testing.T) {
		allocs := testing.AllocsPerRun(50, func() { writeImmRound(t, p, sb, rb) })
		if allocs != 0 {
			t.Errorf("%v allocations per batch of 16 WRITE_WITH_IMM (post + poll)", allocs)
		}
		// The event loop's idle path: arm, poll empty, no event pending.
		allocs = testing.AllocsPerRun(50, func() {
			_ = s.cq.ReqNotify(false)
			_, _ = s.cq.Poll(s.wcs)
			if cq, err := s.cc.GetEvent(); err == nil {
				cq.Ack(1)
			}
		})
		if allocs != 0 {
			t.Errorf("%v allocations per ReqNotify + Poll + GetEvent (EAGAIN)", allocs)
		}
	})

	p.close(t)
}

// writeImmRound is one round of the data path: 16 receives posted on the
// server in one batch, 16 signaled WRITE_WITH_IMM posted by the client in
// one batch, both CQs polled in batches.
func writeImmRound(t testing.TB, p *pair, sb *SendBatch, rb *RecvBatch) {
	c, s := p.client, p.server
	for i := range 16 {
		_ = rb.Add(uint64(i))
		_ = sb.Add(SendWR{ID: uint64(i), Opcode: WRWriteWithImm, Flags: SendSignaled, Imm: uint32(i),
			RemoteAddr: p.serverAddr + uint64(i*slot), RKey: p.serverRKey}, c.mr.SGE(i*slot, slot))
	}
	if _, err := rb.Post(s.qp); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Post(c.qp); err != nil {
		t.Fatal(err)
	}
	c.pollN(t, 16)
	s.pollN(t, 16)
}

func TestLabReject(t *testing.T) {
	needLab(t)
	sch, cch := newChannel(t), newChannel(t)
	l := listen(t, sch)
	c, cpd := dial(t, cch, l, 9)
	req := waitEvent(t, sch, EventConnectRequest)
	if !bytes.Equal(req.PrivateData[:pdLen], cpd) {
		t.Fatalf("private data % x", req.PrivateData)
	}
	why := []byte("no such session, go away")
	if err := req.ID.Reject(why); err != nil {
		t.Fatal(err)
	}
	rej := waitEvent(t, cch, EventRejected)
	if !bytes.HasPrefix(rej.PrivateData, why) {
		t.Errorf("reject private data % x, want prefix %q", rej.PrivateData, why)
	}
	t.Logf("rejected: status %d, %d bytes of private data", rej.Status, len(rej.PrivateData))
	if rej.Status != 28 { // IB_CM_REJ_CONSUMER_DEFINED
		t.Errorf("reject status %d, want 28 (consumer defined)", rej.Status)
	}
	if err := req.ID.Destroy(); err != nil {
		t.Error(err)
	}
	c.close(t)
	if err := l.Destroy(); err != nil {
		t.Error(err)
	}
	if err := cch.Close(); err != nil {
		t.Error(err)
	}
	if err := sch.Close(); err != nil {
		t.Error(err)
	}
}

func TestLabConnectRefused(t *testing.T) {
	needLab(t)
	cch := newChannel(t)
	id := mustNewID(t, cch)
	// Nobody listens on port 1: the route resolves, the connect is
	// rejected by the peer's CM.
	if err := id.ResolveAddr(netip.AddrPortFrom(clientIP, 0), netip.AddrPortFrom(serverIP, 1), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, cch, EventAddrResolved)
	if err := id.ResolveRoute(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, cch, EventRouteResolved)
	e := newEnd(t, id)
	if err := id.Connect(ConnParam{RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, cch, EventRejected)
	t.Logf("connect to a closed port: %v", ev)
	e.close(t)
	if err := cch.Close(); err != nil {
		t.Error(err)
	}
}

func mustNewID(t testing.TB, ch *EventChannel) *CMID {
	t.Helper()
	id, err := ch.NewID(PSTCP)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestLabDiscovery(t *testing.T) {
	needLab(t)
	devs, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		t.Logf("%s netdevs %v ports %+v", d.Name, d.Netdevs, d.Ports)
	}
	d, port, netdev, err := DeviceForIP(clientIP)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "rxe0" || netdev != "veth0" || port.Num != 1 || !port.Active() || port.LinkLayer != "Ethernet" {
		t.Errorf("%v: device %s port %d %v %s netdev %s", clientIP, d.Name, port.Num, port.State, port.LinkLayer, netdev)
	}
	if len(port.Netdevs) == 0 || port.Netdevs[0] != "veth0" {
		t.Errorf("rxe0 port netdevs %v", port.Netdevs)
	}
	d, _, _, err = DeviceForIP(serverIP)
	if err != nil || d.Name != "rxe1" {
		t.Errorf("%v: %s, %v", serverIP, d.Name, err)
	}
	if _, err := os.Stat("/sys/class/infiniband/rxe0"); err != nil {
		t.Error(err)
	}
}

func BenchmarkLabWriteImm(b *testing.B) {
	p := connect(b)
	sb := NewSendBatch(16, 2)
	defer sb.Free()
	rb := NewRecvBatch(16, 1)
	defer rb.Free()
	b.SetBytes(16 * slot)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		writeImmRound(b, p, sb, rb)
	}
	b.StopTimer()
	p.close(b)
}
