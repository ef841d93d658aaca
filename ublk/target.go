package ublk

// A Target serves the block requests of a device. It is shared by the
// device's queues; the per-queue work is done by the QueueHandler that
// NewQueue returns.
type Target interface {
	// NewQueue is called on queue q's own thread before the queue fetches
	// any request. The handler it returns is used only on that thread.
	NewQueue(q *Queue) (QueueHandler, error)
}

// A QueueHandler serves the requests of one queue, on the queue's thread.
// It must not block: it completes a request at once with Queue.Complete, or
// later, from OnCompletion or another callback on the same thread.
type QueueHandler interface {
	// Handle starts request tag. req and its buffer stay valid until the
	// request is completed; they are reused afterwards.
	Handle(tag uint16, req *Request)

	// OnCompletion receives the completion of an entry that the handler
	// submitted to the queue's ring with user data made by TargetUserData.
	OnCompletion(userData uint64, res int32, flags uint32)

	// Close releases the handler's resources; the queue is done with it.
	Close() error
}

// A Flusher is a QueueHandler that batches work (sends, submissions) while
// it handles a round of completions: the queue calls Flush after each round,
// before it waits again.
type Flusher interface {
	Flush()
}

// Request is one block request as the kernel passed it in a tag's
// descriptor.
type Request struct {
	Op          uint8
	Flags       uint32 // IOFlag* bits of the descriptor
	StartSector uint64
	NrSectors   uint32
	// Buf is the tag's buffer cut to the request's data length for reads
	// and writes (nil for other operations). For a write it holds the data
	// to write; for a read the target fills it.
	Buf []byte
	// Fixed says that a read's or write's data is not in Buf (nil) but in
	// the request's own pages, which the kernel installed as fixed buffer
	// BufIndex of the queue's ring (see ZeroCopier): the target moves it
	// with PrepReadFixedAt and PrepWriteFixedAt, at offsets from 0, or
	// copies between them and Buf, which is then the tag's buffer as
	// scratch that the kernel neither fills nor reads, with
	// Queue.CopyToRequest and CopyFromRequest.
	Fixed    bool
	BufIndex uint16
}

// A ZeroCopier is a Target whose queues can serve a request from its own
// pages, in the queue ring's fixed buffers, instead of from the tag's
// buffer. Where the driver offers FlagAutoBufReg (Linux 6.16) and the
// device has no caller's buffer region, Create asks for it when ZeroCopy
// says so: the kernel then installs each request's pages as fixed buffer
// (tag) while the request is served, and copies no data to or from the
// tags' buffers. Reads and writes come with Request.Fixed set.
type ZeroCopier interface {
	ZeroCopy() bool
}

// Offset returns the request's byte offset on the device.
func (r *Request) Offset() int64 { return int64(r.StartSector) << 9 }

// Len returns the request's length in bytes.
func (r *Request) Len() int { return int(r.NrSectors) << 9 }

// userDataTarget marks ring entries that a QueueHandler submitted; the
// queue's own commands have this bit clear and the tag in the low 16 bits.
const userDataTarget = 1 << 63

// TargetUserData makes the user data of an entry that a QueueHandler
// submits to its queue's ring: v (any value below 2^63) comes back to
// OnCompletion unchanged.
func TargetUserData(v uint64) uint64 { return v | userDataTarget }

// TargetValue returns the value passed to TargetUserData.
func TargetValue(userData uint64) uint64 { return userData &^ userDataTarget }
