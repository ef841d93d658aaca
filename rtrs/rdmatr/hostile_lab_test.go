package rdmatr

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
)

// The adversarial tests over soft-RoCE: a peer that breaks the rules on
// purpose with raw verbs.

// A path that joins an established session with an IO connection only (no
// cid 0, so no INFO_REQ) and RDMA-writes a well-formed WRITE into one of
// the session's chunks, with the session's own rkey, gets nothing served:
// the server closes the path at its first request. (Before the session
// layer, the request was served: rules were checked per path state only
// for new connections.)
func TestLabHostileIOBeforeEstablishment(t *testing.T) {
	e := startLabIdle(t, 1, 1, 1, 1, time.Second) // one session, its queue idle
	pc := e.cl.live[0].Load()
	if pc == nil {
		t.Fatal("the session's path is not live")
	}
	const buf = labQD - 1
	chunk := pc.chunks[buf]
	before := e.backend.ios.Load()

	// Another port of the server: a second path of a session may not join
	// the same addresses (EEXIST).
	dst, err := e.srv.Listen(netip.AddrPortFrom(srv1, 0))
	if err != nil {
		t.Fatal(err)
	}
	req := rtrs.ConnReq{CID: 1, CIDNum: 2, SessUUID: rtrs.UUID{0xEE, 0xEE}, PathsUUID: e.cl.s.PathsUUID(), FirstConn: true}
	ch, pd, cn := rawConnect(t, dst, req)
	if ch == nil {
		t.Fatal("the server refused a lone IO connection")
	}

	// A WRITE of 4 KiB to byte 0 of the backend, laid out as a client
	// lays it into the chunk.
	p := e.cl.Params()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = 0xA5
	}
	var usr [8]byte
	binary.LittleEndian.PutUint64(usr[:], 0)
	l, err := rtrs.WriteLayout(len(data), len(usr), uint32(p.ChunkSize), uint32(p.MaxHdrSize))
	if err != nil {
		t.Fatal(err)
	}
	local := make([]byte, p.ChunkSize)
	if _, err := rtrs.PutWriteReq(local, data, usr[:]); err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(local, rdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Dereg()
	imm, err := p.Codec.IOReq(buf, l.HdrOff)
	if err != nil {
		t.Fatal(err)
	}
	sb := rdma.NewSendBatch(2, 1)
	defer sb.Free()
	if err := sb.Add(rdma.SendWR{Opcode: rdma.WRWriteWithImm, Flags: rdma.SendSignaled, Imm: imm,
		RemoteAddr: chunk.Addr + uint64(l.WriteOff), RKey: chunk.RKey}, mr.SGE(int(l.WriteOff), int(l.WriteLen))); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Post(cn.qp); err != nil {
		t.Fatal(err)
	}
	ev, err := waitCM(ch, 10*time.Second)
	if err != nil {
		t.Fatalf("the server did not close the path: %v", err)
	}
	if ev.Type != rdma.EventDisconnected {
		t.Fatalf("CM event %v, want DISCONNECTED", ev.Type)
	}
	if n := e.backend.ios.Load() - before; n != 0 {
		t.Fatalf("%d requests served on a path that never completed session establishment", n)
	}
	e.backend.mu.Lock()
	first := e.backend.mem[0]
	e.backend.mu.Unlock()
	if first == 0xA5 {
		t.Fatal("the backend holds the hostile write")
	}
}

// rawConnect connects a raw-verbs connection to the server at dst with
// req as its private data, from cli1; it returns nil channel if the server
// rejects it. The test's cleanup frees it all.
func rawConnect(t *testing.T, dst netip.AddrPort, req rtrs.ConnReq) (*rdma.EventChannel, *rdma.PD, *conn) {
	t.Helper()
	ch, err := rdma.NewEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	if err := ch.SetNonblock(true); err != nil {
		t.Fatal(err)
	}
	id, err := ch.NewID(rdma.PSTCP)
	if err != nil {
		t.Fatal(err)
	}
	const to = 5 * time.Second
	if err := id.ResolveAddr(netip.AddrPortFrom(cli1, 0), dst, to); err != nil {
		t.Fatal(err)
	}
	if _, err := expectCM(ch, rdma.EventAddrResolved, to); err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveRoute(to); err != nil {
		t.Fatal(err)
	}
	if _, err := expectCM(ch, rdma.EventRouteResolved, to); err != nil {
		t.Fatal(err)
	}
	pd, err := id.Context().AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Dealloc() })
	cn, err := newConn(id, pd, req.CID, 8, 8, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cn.destroy(true) }) // before the PD: cleanups run last first
	var b [rtrs.ConnReqSize]byte
	req.MarshalTo(b[:])
	if err := id.Connect(rdma.ConnParam{PrivateData: b[:], RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := expectCM(ch, rdma.EventEstablished, to); err != nil {
		t.Logf("connect: %v", err)
		return nil, nil, nil
	}
	return ch, pd, cn
}

// One session's rkey is useless to another: a client whose connection
// belongs to a session of its own RDMA-writes into the chunk pool of
// another session with that session's address and rkey (as a client that
// learnt them would), and gets a remote access error; the other session's
// chunk keeps its bytes. Each session has its own protection domain (the
// kernel's server shares one per device, where this write lands).
func TestLabHostileOtherSessionsRkey(t *testing.T) {
	e := startLabIdle(t, 1, 1, 1, 1, time.Second)
	pc := e.cl.live[0].Load()
	if pc == nil {
		t.Fatal("the session's path is not live")
	}
	const buf = labQD - 1
	chunk := pc.chunks[buf] // the victim's: address and rkey
	e.srv.mu.Lock()
	var victim []byte
	for _, ss := range e.srv.sess {
		victim = ss.chunks[buf*labChunk : (buf+1)*labChunk]
	}
	e.srv.mu.Unlock()
	if victim == nil {
		t.Fatal("the server has no session")
	}
	before := append([]byte(nil), victim[:4096]...)

	dst, err := e.srv.Listen(netip.AddrPortFrom(srv1, 0))
	if err != nil {
		t.Fatal(err)
	}
	// The first connection of a session of its own: a new paths_uuid.
	req := rtrs.ConnReq{CID: 0, CIDNum: 1, SessUUID: rtrs.UUID{0xAB}, PathsUUID: rtrs.UUID{0xAB, 0xCD}, FirstConn: true}
	_, pd, cn := rawConnect(t, dst, req)
	if cn == nil {
		t.Fatal("the server refused the attacker's session")
	}
	data := make([]byte, 4096)
	for i := range data {
		data[i] = 0x5A
	}
	mr, err := pd.RegMR(data, rdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Dereg()
	sb := rdma.NewSendBatch(1, 1)
	defer sb.Free()
	if err := sb.Add(rdma.SendWR{Opcode: rdma.WRWrite, Flags: rdma.SendSignaled, RemoteAddr: chunk.Addr, RKey: chunk.RKey}, mr.SGE(0, len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Post(cn.qp); err != nil {
		t.Fatal(err)
	}
	wcs := make([]rdma.WC, 4)
	var got *rdma.WC
	for deadline := time.Now().Add(10 * time.Second); got == nil && time.Now().Before(deadline); {
		n, err := cn.cq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range wcs[:n] {
			if wcs[i].Opcode&rdma.WCRecv == 0 {
				got = &wcs[i]
			}
		}
		time.Sleep(time.Millisecond)
	}
	if got == nil {
		t.Fatal("the write to the other session's chunk never completed")
	}
	if got.Status != rdma.WCRemAccessErr {
		t.Errorf("write with another session's rkey: completion %v, want %v", got.Status, rdma.WCRemAccessErr)
	}
	e.srv.mu.Lock()
	after := append([]byte(nil), victim[:4096]...)
	e.srv.mu.Unlock()
	if !bytes.Equal(after, before) {
		t.Fatal("the other session's chunk holds the attacker's bytes")
	}
}

// The stale write of a partition over RDMA: the network holds path A's
// packets (netem delays everything leaving the client's veth0 by 2 s), the
// client gives A up when its heartbeats stop, fails its write over to B
// and gets it answered; then a newer write to the same place, answered.
// The server, whose heartbeat timeout is longer, never saw A fail. When
// A's packets arrive at last, the stale RDMA write must neither land in
// the chunk nor run: the client had the server fence A (FenceReq on B),
// which moved A's QPs to the error state, before it resent.
func TestLabHostileStaleWriteAfterPartition(t *testing.T) {
	needLab(t)
	_ = exec.Command("modprobe", "sch_netem").Run()
	if out, err := exec.Command("tc", "qdisc", "add", "dev", "veth0", "root", "netem", "delay", "1ms").CombinedOutput(); err != nil {
		if labtest.InLab() {
			t.Fatalf("no netem on the lab's veth0: %v: %s", err, out)
		}
		t.Skipf("no netem on veth0 (tc qdisc add ... netem: %v: %s): the partition cannot be made here", err, out)
	}
	delQdisc := func() { _ = exec.Command("tc", "qdisc", "del", "dev", "veth0", "root").Run() }
	t.Cleanup(delQdisc)
	delQdisc()
	backend := &memBackend{mem: make([]byte, 1<<20)}
	srv, err := NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: labQD, ChunkSize: labChunk, Logf: t.Logf}, Handler: backend}) // heartbeats: 5 s × 5
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	a1, err := srv.Listen(netip.AddrPortFrom(srv1, 0))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := srv.Listen(netip.AddrPortFrom(srv2, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := DialClient(ctx, ClientConfig{ClientConfig: rtrs.ClientConfig{SessName: "partition", Paths: []PathAddr{{Src: cli1.String(), Dst: a1.String()}},
		Queues: 1, Policy: rtrs.RoundRobin, ReconnectDelay: 200 * time.Millisecond,
		MaxReconnectAttempts: -1, HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 3, Timeout: 5 * time.Second, Logf: t.Logf},
		RegionSize: 4 * blockSz})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	if cl.Params().Flags&rtrs.FlagFence == 0 {
		t.Fatal("the server does not offer fencing")
	}
	go cl.Queue(0).Run(nil)
	region := cl.Region()
	old, fresh := region[:blockSz], region[blockSz:2*blockSz]
	for i := range old {
		old[i], fresh[i] = 'o', 'n'
	}
	write := func(data []byte) <-chan int {
		got := make(chan int, 1)
		var usr [8]byte // byte 0 of the backend
		r := &Request{Write: true, Usr: usr[:], Data: data, Done: func(_ *Request, errno int) { got <- errno }}
		onQueue(cl.Queue(0), func(q *ClientQueue) {
			if err := q.Submit(r); err != nil {
				got <- -int(syscall.EINVAL)
			}
		})
		return got
	}
	wait := func(got <-chan int, what string) {
		t.Helper()
		select {
		case errno := <-got:
			if errno != 0 {
				t.Fatalf("%s: errno %d", what, errno)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not end; paths %+v", what, cl.Paths())
		}
	}
	if out, err := exec.Command("tc", "qdisc", "add", "dev", "veth0", "root", "netem", "delay", "2s").CombinedOutput(); err != nil {
		t.Fatalf("netem: %v: %s", err, out)
	}
	w1 := write(old)
	time.Sleep(50 * time.Millisecond) // W1 is on the wire, held
	if _, err := cl.AddPath(PathAddr{Src: cli2.String(), Dst: a2.String()}); err != nil {
		t.Fatal(err)
	}
	wait(w1, "W1 (failed over)")
	wait(write(fresh), "W2")
	time.Sleep(3 * time.Second) // path A's packets arrive
	delQdisc()
	backend.mu.Lock()
	got := append([]byte(nil), backend.mem[:blockSz]...)
	backend.mu.Unlock()
	if string(got[:8]) != "nnnnnnnn" || string(got[blockSz-8:]) != "nnnnnnnn" {
		t.Fatalf("the place holds %q…%q: the acknowledged write was overwritten by the stale copy", got[:8], got[blockSz-8:])
	}
}
