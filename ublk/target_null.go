package ublk

// NullTarget completes every request at once without moving data: reads
// return the buffer as it is, writes are dropped. It measures the cost of
// the ublk path itself.
type NullTarget struct{}

// ZeroCopy implements ZeroCopier: there is no data to move.
func (NullTarget) ZeroCopy() bool { return true }

// NewQueue implements Target.
func (NullTarget) NewQueue(q *Queue) (QueueHandler, error) { return nullQueue{q}, nil }

type nullQueue struct{ q *Queue }

func (h nullQueue) Handle(tag uint16, req *Request) {
	res := int32(0)
	if req.Op == OpRead || req.Op == OpWrite {
		res = int32(req.Len())
	}
	h.q.Complete(tag, res)
}

func (nullQueue) OnCompletion(uint64, int32, uint32) {}
func (nullQueue) Close() error                       { return nil }
