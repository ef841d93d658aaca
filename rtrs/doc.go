// Package rtrs implements the RTRS transport (RDMA Transport) of the Linux
// kernel, protocol version 2.0 as in Linux 6.12: its wire messages, sessions,
// paths and per-CPU connections, over RDMA verbs and over TCP.
//
// It knows nothing of ublk or of the block layer: its users hand it a user
// header and buffers from a registered region and get a completion back.
//
// # Wire codecs
//
// Every RTRS message has a Go type with the same three methods:
//
//	Size() int                          // encoded size in bytes
//	MarshalTo(b []byte) (int, error)    // encode into b, return bytes written
//	Unmarshal(b []byte) error           // decode and validate b
//
// Multi-byte fields are little-endian. MarshalTo never allocates; it refuses
// to encode a value that Unmarshal would reject, and fails with
// ErrShortBuffer when b is too small. Unmarshal accepts input longer than
// the message (as the kernel accepts a received length >= sizeof) and
// ignores reserved bytes, but rejects truncated input, a wrong magic, a wrong
// major version, an unexpected type and out-of-range fields. Errors wrap
// one of the sentinels ErrTruncated, ErrShortBuffer, ErrBadMagic,
// ErrBadVersion, ErrBadType, ErrOutOfRange and ErrMsgSize (use errors.Is)
// and say which message and field were wrong; on error the receiver is left
// unchanged. Fixed-size messages decode without allocating; messages with
// descriptor arrays (InfoRsp, RdmaReadMsg) decode into the capacity of the
// caller's Desc slice. Checks that need session parameters (queue depth,
// chunk size) are separate: ImmCodec, InfoRsp.ChunkBufs, RkeyRsp.CheckBufID,
// ParseIOReq.
//
// Messages: ConnReq and ConnRsp (RDMA CM private data), InfoReq and InfoRsp
// (session establishment on connection 0), RdmaWriteMsg and RdmaReadMsg (the
// RTRS header of an IO request inside a server chunk), RkeyRsp (new rkey
// after always_invalidate), SGDesc (remote buffer descriptor).
//
// Immediate data (IO_REQ, IO_RSP, IO_RSP_W_INV, HB_MSG, HB_ACK) is encoded
// and decoded by an ImmCodec built from the session's queue depth and chunk
// size (host order; rdma.ImmToWire converts to the verbs API's network
// order).
//
// An IO request lies in a chunk as data at offset 0, the user message after
// it and the RTRS header after that; the immediate carries the header's
// offset. WriteLayout and ReadLayout compute that layout on the client,
// ParseIOReq takes it apart on the server, PutWriteReq/PutReadReq build it
// in a chunk-shaped buffer.
//
// # Client queues
//
// A client session hands its user one Queue per CPU on either transport
// (tcp.ClientQueue, rdmatr.ClientQueue): Submit a Request, get Done on
// the queue's thread. PathAddr, Params (ConnRsp.Params), ClientConfig,
// MPPolicy, Permits and the statistics are shared by both transports and
// live here. What a queue does with its requests does not depend on the
// transport either, but is no user's business: rtrs/internal/clientq
// (permits, waiting, failover, completion, the control mailbox, the
// event loop) and rtrs/internal/session (paths and their state machine).
//
// # Failover and the server's chunks
//
// A client resends a failed path's requests on another path with the same
// permits, hence the same server chunks, and reuses a chunk once the resend
// is answered. The server may still be running the stale copy from the
// failed path. A chunk gate (rtrs/internal/chunkgate, RDMA server) and the chunk's busy flag (TCP
// server) let one request at a time use a chunk across the paths of a
// session, so a resend, and every later request on its chunk, waits until
// the stale copy is done. A stale request that the server has read but not
// started when it sees its path close never starts (ServerPath.Serving).
// And a client gives a path up only through a fence, where the server
// offers it (FlagFence, asked for by ConnReq.Fence): it asks the server, on
// another path, to close the path (FenceReq, ServerTable.FencePath), or
// connects the path again, before the path's requests go again
// (clientq.Core.Hold); so no copy the server still has unread, nor over RDMA a
// delayed write into its chunks, comes after the resend. With a kernel
// peer there is no fence, and one window stays open, as in the kernel's
// RTRS: a stale request of a path whose failure the server has not seen
// yet can run after its resend has been answered, as a repeated write.
//
// # Server sessions
//
// ServerTable is the session layer of a server, shared by its transports:
// it admits connections within its limits (ConnSlot), applies the
// kernel's session and path checks to connection requests (Attach) and
// INFO_REQs (Establish), keeps each path's state (ServerPathState), and
// releases a session once its last path has been gone for the linger time
// (the upper layer's OnRelease, then the transports' OnFree hooks and the
// pool's unmapping once no request Holds the session).
package rtrs
