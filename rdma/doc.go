// Package rdma is a thin interface to RDMA CM and verbs through rdma-core
// (librdmacm, libibverbs) via cgo: event channels, connection setup with
// private data, RC queue pairs, completion queues and memory registration.
//
// It knows nothing of RTRS; it is the verbs layer the rtrs package builds on.
//
// # Shape
//
// The API follows rdma-core closely, one concept per file, in the manner of
// golang.org/x/sys/unix: each method wraps one library call, named in its
// doc comment, and its errors wrap the errno with the call's name and main
// argument ("rdma_resolve_addr 192.0.2.2:1234: no route to host"), so
// errors.Is(err, unix.ETIMEDOUT) works.
//
//   - cm.go: EventChannel (Fd, SetNonblock, GetEvent → Event, Event.Ack),
//     CMID (Bind, Listen, ResolveAddr, ResolveRoute, Connect, Accept,
//     Reject, Disconnect, Destroy, LocalAddr, PeerAddr, DeviceName, PortNum).
//   - device.go: Context, the device an id is bound to (QueryDevice).
//   - pd.go, mr.go: PD, MR (RegMR with Access flags: LKey, RKey, Addr).
//   - cq.go: CompChannel (Fd, GetEvent), CQ (ReqNotify, Ack, Poll), WC.
//   - qp.go: QP, an RC queue pair created on a CM id (rdma_create_qp).
//   - wr.go: SendBatch and RecvBatch, batched posting.
//   - discovery.go: RDMA devices, ports and their network interfaces from
//     sysfs; DeviceForIP.
//
// A connection goes the usual RDMA CM way. Active side: NewID, ResolveAddr
// → EventAddrResolved, ResolveRoute → EventRouteResolved, CreateQP,
// Connect → EventEstablished (or EventRejected, EventUnreachable, ...).
// Passive side: NewID, Bind, Listen → EventConnectRequest, whose Event.ID
// is the new connection's id: CreateQP on it, then Accept (→
// EventEstablished) or Reject. Either side ends with Disconnect →
// EventDisconnected, then Destroy.
//
// # Waiting without blocking a thread
//
// Both kinds of channel expose their file descriptor (EventChannel.Fd,
// CompChannel.Fd) so that an event loop can wait for them with poll(2),
// epoll or an io_uring poll request; after SetNonblock(true) their
// GetEvent returns an error matching unix.EAGAIN when nothing is pending.
// A completion queue's usual cycle is: ReqNotify, Poll until empty, wait
// for the channel fd, CompChannel.GetEvent, CQ.Ack (may be batched),
// ReqNotify, Poll...
//
// # Few cgo crossings, no allocation on the data path
//
// Posting and polling cost one cgo call per batch, not per work request,
// and allocate nothing:
//
//   - SendBatch and RecvBatch hold their work requests and SGEs in C
//     memory (cgo forbids passing Go memory that holds Go pointers, and a
//     chain of ibv_send_wr is exactly that). Add writes a request straight
//     into that memory; Post chains the requests and posts them all with
//     one ibv_post_send (ibv_post_recv).
//   - CQ.Poll polls up to len(wcs) completions with ibv_poll_cq into a C
//     array and converts them into the caller's []WC, all in one call.
//   - ReqNotify, CompChannel.GetEvent and CQ.Ack do not allocate either;
//     the lab tests check all of this with testing.AllocsPerRun.
//
// # Immediate data
//
// Immediate data is a __be32 in verbs: its bytes go on the wire as they lie
// in memory. The kernel's RTRS sets it with cpu_to_be32 and reads it with
// be32_to_cpu, so the value is big-endian on the wire. This package does the
// same: SendWR.Imm and WC.Imm are host-order values, converted with htonl
// when posting and ntohl when polling. ImmToWire and ImmFromWire do the same
// conversion for code that builds or parses raw frames.
//
// # Memory registration
//
// RegMR registers memory that the device reads and writes asynchronously.
// The caller guarantees that it stays where it is, alive, until Dereg: use
// memory from mmap(2) (unix.Mmap), never the Go heap, which the garbage
// collector may move or free and whose addresses C must not keep.
//
// # Private data
//
// Connect, Accept and Reject carry private data. Over IB and RoCE in the TCP
// port space the limits are 56 bytes for a connect request, 196 for an
// accept and 148 for a reject, and the receiver's Event.PrivateData has the
// full size of the message: what the peer sent, then zeros. A protocol on
// top must carry its own lengths.
//
// # Device discovery
//
// Devices, DeviceForNetdev and DeviceForIP read /sys/class/infiniband
// directly (github.com/Mellanox/rdmamap is not used): each device's ports,
// their state and link layer, and the network interfaces they map to
// (ports/N/gid_attrs/ndevs/*, else the device's parent or device/net/*).
//
// # Concurrency
//
// Objects may be used from any goroutine, but a SendBatch, RecvBatch or
// the []WC given to Poll belongs to one goroutine at a time; a queue thread
// keeps its own. rdma-core itself is thread-safe.
//
// # Testing
//
// Host tests cover the pure logic (sockaddr conversion, immediate byte
// order, sysfs parsing against a fake tree, batch building). The TestLab*
// tests and BenchmarkLabWriteImm need soft-RoCE and run in the qemu lab
// (tools/lab), over the veth pair 192.0.2.1 (rxe0) ↔ 192.0.2.2 (rxe1).
package rdma
