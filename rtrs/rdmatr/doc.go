// Package rdmatr carries RTRS over RDMA (rdma CM + verbs, package rdma),
// wire-compatible with the Linux 6.12 kernel's RTRS 2.0. Its API is that
// of package rtrs/tcp, so that RNBD can sit on either transport: a Client
// whose path API is the shared session layer's (rtrs/internal/session:
// paths, reconnects, heartbeats, fences), with per-queue ClientQueues
// on the shared queue skeleton (rtrs/internal/clientq) (rtrs.Queue: Submit, Done callbacks on the queue's thread, Run with its
// own io_uring or Attach/HandleCQE/Flush on an external one, and Detach
// when that loop stops), and a Server with a ServerHandler and
// ServerIO.Complete. This package supplies only what RDMA does: connect
// (client_connect.go), the service connection (client_service.go), the
// connection sets and registered memory (client_conns.go, region.go), the
// queues' posts and polls (client_queue.go) and the server's stages
// (server_accept.go, server_loop.go, server_io.go, server_path.go). The
// server runs to completion as the client does: one loop per CPU, a
// pinned thread whose io_uring polls the completion channels of its
// connections (connection cid goes to loop cid mod loops), serves their
// requests and posts each batch's answers with one ibv_post_send.
//
// # Connection setup
//
// A client path is cid 0 (service connection) plus one IO connection per
// queue (cid 1..Queues), each an RC QP with its own completion channel and
// CQ. The client resolves address and route and connects the cids one
// after another, with the 56-byte rtrs.ConnReq as private data (cid_num =
// Queues+1, path and session UUIDs, first_conn set but on the connects
// of a path added to a live session before it ever connected, as the
// kernel). The server answers with rtrs.ConnRsp (queue_depth, max_io_size
// = chunk − max_hdr, max_hdr_size, flags 0, or rtrs.FlagFence to a client
// that asked for fencing) in rdma_accept, or rejects with the negative
// errno in the same structure. When all cids are up the client SENDs
// INFO_REQ on cid 0 and the server SENDs INFO_RSP with one descriptor
// covering its whole chunk pool (queue_depth × chunk, mmap'd and registered
// once per device): with flags 0 the kernel client accepts several chunks
// per MR, sg_cnt (1) dividing queue_depth.
//
// # IO
//
// Writes: one RDMA-WRITE-with-IMM into chunk buf_id at offset 0, gathering
// [Data from the client's registered region] + [user message + RdmaWriteMsg
// from a registered header area]; imm = IO_REQ(buf_id, D+U). Reads: one
// RDMA-WRITE-with-IMM of user message + RdmaReadMsg with one descriptor
// (address, rkey and length of Data in the region, flags 0: no
// NEED_INVAL, as the client does not register memory per request) to chunk
// offset D. The server answers a successful read with an RDMA WRITE of the
// data to the descriptor, then, as every answer, a zero-length
// RDMA-WRITE-with-IMM carrying IO_RSP(msg_id = buf_id, errno) — exactly
// what the kernel server posts without always_invalidate. The buffer id is
// the session permit (rtrs.Permits), shared by all paths, so an in-flight
// request fails over to another path with the same chunk.
//
// The client posts 2·queue_depth receives per IO connection (8-byte
// slots, room for an RKEY_RSP) and re-posts one per consumed receive; an
// RKEY_RSP from a kernel server with always_invalidate updates that
// chunk's rkey for the next request. The server posts queue_depth empty
// receives per connection (plus the INFO_REQ buffer on cid 0).
//
// # Registered memory
//
// Request.Data must lie inside the client's Region (ClientConfig.Region,
// or RegionSize bytes mapped by DialClient, see Client.Region): memory from
// mmap(2) that never moves, registered with local and remote write access
// on the device of every path. Registered memory is pinned, so the region
// may be split into parts (ClientConfig.RegionPartSize) that are
// registered one by one when the caller needs them (Client.RegisterPart),
// on every path and again on each reconnect; each part has its own rkey
// per path. Submit refuses data outside the region, straddling two parts
// or in a part not registered, with EINVAL. The user message may live
// anywhere; it is copied into the header area.
//
// # Isolation between sessions, without always_invalidate
//
// The server advertises flags 0 (no FlagNewRkey): its chunk pool stays
// registered for remote write for the life of the session and one rkey
// serves all chunks of the session on a device. A client can therefore
// RDMA-write any chunk of its own session at any time, including chunks
// whose request the server is still processing (it can change data the
// handler is reading or writing), and the client's region likewise stays
// writable by the server with one rkey per part and path.
//
// Between sessions the device keeps them apart: each session has its own
// protection domain on each device, its connections' QPs and its pool's
// registration in it, so the rkey of one session's pool is refused on any
// other session's QP (the writer gets a remote access error, and nothing
// is written). The kernel's server shares one protection domain per device
// among all sessions, where a client that learns another session's address
// and rkey can write into that session's chunks.
//
// # Failures
//
// A work completion error or a CM event (DISCONNECTED, ...) on any
// connection of a path, or missed heartbeats (HB_MSG/HB_ACK zero-length
// writes-with-imm on cid 0, both ways), fail the path: its requests are
// re-sent on another path (the multipath policy) or wait, the connections
// are disconnected and freed once no queue polls them (a queue that no
// event loop ever drove, as RNBD's queues of devices not mapped yet, does
// not hold them up), and the path
// reconnects after ReconnectDelay, up to MaxReconnectAttempts failed
// attempts in a row; then it stays disconnected. With no path left that
// may come back, waiting requests fail with -ENOTCONN.
//
// Between urnbd peers (ConnReq.Fence asked, rtrs.FlagFence answered) a
// failed path's requests are re-sent only once the server has closed the
// path: the client sends a FenceReq (a SEND of rtrs.FenceReqSize bytes) on
// cid 0 of another connected path; the server shuts the named path, whose
// QPs are then in the error state (no RDMA write of the client lands in
// the chunks any more), and answers with a zero-length write-with-imm of
// type rtrs.ImmFenceRsp; or the path connects again, which the server
// allows only once the old path is gone. A kernel peer neither asks nor
// answers, and sees the kernel's wire.
//
// Paths are managed at run time as with the kernel's sysfs files:
// Client.AddPath, RemovePath, DisconnectPath, ReconnectPath and
// SetMaxReconnectAttempts, with the API of package rtrs/tcp. A path that
// is removed, disconnected or reconnected hands its requests to the other
// paths exactly as a failed one.
//
// When a device goes away (rdma link delete, DEVICE_REMOVAL), the path
// fails over and frees its resources on the device, then has librdmacm
// rescan the devices (rdma.ForgetRemovedDevices) so that it closes the
// device: the kernel finishes the removal only then. Once the device is
// back, the path reconnects.
//
// Client.CompletionQueues lists the CQ of every connection with the
// user_handle the kernel knows it by, for eBPF programs on the completion
// path.
//
// # Tests
//
// Host tests cover the pure logic. TestLab* need soft-RoCE and run in the
// qemu lab (tools/lab); they provision rxe themselves and find the
// repository from their source file, so any working directory works.
package rdmatr
