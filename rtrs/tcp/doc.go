// Package tcp carries RTRS over TCP, for hosts without RDMA. It keeps the
// meaning of every RTRS message and immediate value, so that one
// session/path layer can sit on both transports; only the carrier changes.
//
// # Framing
//
// Everything on a connection, in both directions, is a frame: a fixed
// 12-byte header followed by the payload.
//
//	off 0  le32  imm   the 32-bit RTRS immediate, host-order value stored
//	                   little-endian (not the network order of the verbs API)
//	off 4  le32  len   payload length in bytes
//	off 8  le32  off   chunk offset the payload is written at (IO_REQ only,
//	                   else 0)
//	off 12 len   payload
//
// A frame is the TCP form of one RDMA-WRITE-with-IMM or SEND: imm is its
// immediate, off and len its remote address (relative to the chunk) and
// length. The third word is why the header is not 8 bytes: a READ request
// is written at chunk offset D (its data length), not 0, and the receiver
// must know where to put the payload before it has seen the RTRS header at
// its end.
//
// The immediate type (bits 31..28) says what the frame is:
//
//	type            dir  payload
//	IO_REQ   (0)    c→s  exactly what an RDMA client writes into server chunk
//	                     buf_id at chunk offset off: for a WRITE data, user
//	                     message, RdmaWriteMsg from off 0; for a READ user
//	                     message, RdmaReadMsg and descriptors from off D
//	                     (rtrs.WriteLayout/ReadLayout: off = WriteOff,
//	                     len = WriteLen; rtrs.PutWriteReq/PutReadReq build it).
//	                     The immediate carries (buf_id, header offset) as over
//	                     RDMA; the header must lie inside [off, off+len).
//	IO_RSP   (1)    s→c  immediate (msg_id, errno); for a successful READ the
//	                     read data (at most one chunk), else empty.
//	HB_MSG   (8)    both empty
//	HB_ACK   (9)    both empty
//	CTRL     (15)   both a handshake message; the 28-bit payload of the
//	                     immediate says which (CtrlKind): ConnReq (c→s),
//	                     ConnRsp (s→c), InfoReq (c→s), InfoRsp (s→c), and
//	                     on cid 0 of a serving path FenceReq (c→s) and
//	                     FenceRsp (s→c), in the wire format of package rtrs;
//	                     at most MaxCtrlLen bytes.
//
// Type 15 is unused by RTRS over RDMA; it marks the messages RDMA carries
// out of band (CM private data) or as plain SENDs, so IO and heartbeat frames
// are identical in meaning to their RDMA counterparts. IO_RSP_W_INV (2) and
// RKEY_RSP do not exist over TCP: there are no rkeys to invalidate, and a
// TCP server advertises flags 0 (no FlagNewRkey).
//
// A receiver rejects, and then closes the connection on, any frame whose
// type is not allowed in its direction, whose IO frame arrives before the
// connection response fixed the session parameters, whose length exceeds
// the chunk size (max_io_size + max_hdr_size) or MaxCtrlLen, whose IO_REQ
// does not fit its chunk or does not contain the header its immediate points
// at, or which is truncated. Errors wrap the sentinels of package rtrs.
//
// # Connection setup
//
// A client connects the cids of a path one after another as the kernel
// does: TCP connect, CTRL ConnReq, CTRL ConnRsp. The server admits the
// connection and applies the kernel's checks through its session layer
// (rtrs.ServerTable), and answers a refusal with a ConnRsp carrying the
// negative errno, then closes. When all cids are up,
// the client sends InfoReq (session name) on cid 0 and the server answers
// InfoRsp with a single descriptor {addr 0, key 0, len queue_depth·chunk}
// (there is no memory registration over TCP), which passes the client's
// usual checks. Every handshake read and write has a deadline.
//
// Over TCP two paths of a session are told apart by (source IP, destination
// IP and port), so that two paths can run over loopback to two listeners;
// the kernel compares only the IP pair.
//
// # Data path
//
// A Client has one ClientQueue per CPU; connection cid i+1 of every path
// belongs to queue i, and cid 0 carries the heartbeats. A queue is driven
// by one thread's io_uring: its own (Run) or the one of the event loop it
// is attached to (Attach, HandleCQE, Flush; a ublk queue, for instance).
// Submit never blocks and never allocates: a request takes a permit (a
// server chunk index, shared by the whole session: the credits), the
// multipath policy picks a path, and the frame is queued; Flush writes the
// frames queued during a round of completions with one writev per
// connection. Answers are read by an io_uring read into a per-connection
// buffer and read data is copied into the request's buffer, except that
// the rest of a large payload (16 KiB or more still to come) is read by
// the kernel straight into the request's buffer, by a readv whose second
// part takes what follows into the connection's buffer (the next
// answer's header: one read per large answer). A read whose request
// also names a fixed buffer of the ring (Request.Fixed: pages a driver
// registered there, such as a ublk request's) has that rest read into the
// fixed buffer instead, by a READ_FIXED, and Split says how much of the
// answer came into Data before it. Done runs on the queue's thread.
// Without a permit or a usable path a request waits in its queue (a
// queue that returns a permit wakes queues waiting for one), so a slow
// server pushes back on the submitters instead of
// having requests buffered without bound.
//
// When a connection fails (read or write error, end of stream, or a path
// failed by missed heartbeats or by the user), its requests are sent again
// (once a read into a request's buffer still in the ring has ended),
// with the same chunk index, on another usable path; with none left they
// wait for a reconnect, and fail with -ENOTCONN once no path may come back
// (max_reconnect_attempts exhausted, or all paths removed or
// disconnected). A path reconnects after ReconnectDelay, as often as
// MaxReconnectAttempts allows (-1: always; Client.SetMaxReconnectAttempts
// changes it at run time).
//
// # TLS
//
// With ServerConfig.TLS and ClientConfig.TLS every connection runs a TLS
// 1.3 handshake before its ConnReq, then the kernel's TLS (kTLS) carries
// its records, keyed from the handshake's exporter, so the data path above
// is unchanged (tls.go).
//
// The server serves IO only on a path that completed session
// establishment: an IO frame on a path still CONNECTING closes the path,
// and one read from a path that has closed meanwhile is dropped unserved.
// The server reads each connection with one goroutine; a request's payload
// is read straight into its chunk, the handler serves it (synchronously or
// later, from any goroutine) and the answers of a batch of requests go out
// in one write when the connection has nothing more to read. A chunk is
// taken from the moment its request arrives until its answer is written;
// a client that reuses a chunk before that breaks the protocol.
package tcp
