package rtrs

import "github.com/urnbd/urnbd/uring"

// Queue is one queue of a client session on either transport
// (tcp.ClientQueue, rdmatr.ClientQueue), as its user drives it. A queue
// carries the requests submitted on one thread and completes them on the
// same thread, through one io_uring: its own (Run) or the caller's event
// loop's (Attach, HandleCQE, Flush, Detach). All methods but Run and Do
// must be called on the queue's thread.
type Queue interface {
	// Submit sends r, or queues it until a permit and a path are free. It
	// fails only for a request that can never be sent; then r.Done is not
	// called.
	Submit(r *Request) error
	// Flush sends what Submit queued since the last Flush, in one batch.
	Flush()
	// HandleCQE handles a completion of one of the queue's ring entries
	// (user data with the base given to Attach).
	HandleCQE(cqe *uring.CQE)
	// Attach makes the queue use the calling thread's ring, its entries
	// marked with base; Detach tells it the loop stops driving it.
	Attach(ring *uring.Ring, base uint64)
	Detach()
	// Do runs fn on the queue's thread, soon: for control work, not for
	// each request.
	Do(fn func())
	// Run drives the queue with a ring of its own on the calling
	// goroutine, locked to its thread, calling start there first, until
	// the session closes.
	Run(start func()) error
}
