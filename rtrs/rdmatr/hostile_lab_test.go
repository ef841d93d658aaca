package rdmatr

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

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
	pc := e.cl.paths[0].live.Load()
	if pc == nil {
		t.Fatal("the session's path is not live")
	}
	const buf = labQD - 1
	chunk := pc.chunks[buf]
	before := e.backend.ios.Load()

	ch, err := rdma.NewEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.SetNonblock(true); err != nil {
		t.Fatal(err)
	}
	id, err := ch.NewID(rdma.PSTCP)
	if err != nil {
		t.Fatal(err)
	}
	const to = 5 * time.Second
	if err := id.ResolveAddr(netip.AddrPortFrom(cli1, 0), e.addrs[0], to); err != nil {
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
	defer pd.Dealloc()
	cn, err := newConn(id, pd, 1, 8, 8, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer cn.destroy(true)
	req := rtrs.ConnReq{CID: 1, CIDNum: 2, SessUUID: rtrs.UUID{0xEE, 0xEE}, PathsUUID: e.cl.pathsUUID, FirstConn: true}
	var b [rtrs.ConnReqSize]byte
	req.MarshalTo(b[:])
	if err := id.Connect(rdma.ConnParam{PrivateData: b[:], RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := expectCM(ch, rdma.EventEstablished, to); err != nil {
		t.Fatalf("the server refused a lone IO connection: %v", err)
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
