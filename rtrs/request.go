package rtrs

// Request is one IO request of a client session, on any transport: a read
// or a write carrying a user (RNBD) message. The caller owns it and may
// reuse it once Done has been called; the client never allocates one.
//
// The transports (rtrs/tcp, rtrs/rdmatr) export it under their own name
// (tcp.Request, rdmatr.Request) and add their own rules for Data.
type Request struct {
	// Write is true for a write (Data goes to the server), false for a read
	// (the server's reply lands in Data, len(Data) bytes).
	Write bool
	// Usr is the user message, at most MaxHdrSize minus the RTRS header.
	// It may live anywhere: the transport copies it.
	Usr []byte
	// Data is the data to write or the buffer to read into; at most the
	// session's MaxIOSize (over RDMA it must lie inside the client's
	// registered region). A read without data (a flush) has none.
	Data []byte
	// Fixed, for a read over TCP, says that the data also has a place in
	// fixed buffer BufIndex of the io_uring that drives the queue (pages
	// registered there, len(Data) bytes from offset 0): the transport may
	// read the end of the answer straight into it, and says so in Split.
	// FixedBase is the address io_uring takes for that buffer's byte 0: 0
	// for pages a driver registered (a ublk request's), the memory's
	// address for user memory. RDMA takes no Fixed request.
	Fixed     bool
	BufIndex  uint16
	FixedBase uint64
	// Split is set when a Fixed read is done: its first Split bytes are in
	// Data, the rest only in the fixed buffer.
	Split int
	// Done is called on the queue's thread when the request has ended:
	// errno 0 or a negative errno from the server, or -ENOTCONN when no path
	// could carry it. Make it once (a method value), not per request.
	Done func(r *Request, errno int)
	// Tag is the caller's.
	Tag uint64
}
