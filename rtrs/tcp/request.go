package tcp

import "golang.org/x/sys/unix"

// Request is one IO request of a client: a read or a write carrying a user
// (RNBD) message. The caller owns it and may reuse it once Done has been
// called; the client never allocates one.
type Request struct {
	// Write is true for a write (Data goes to the server), false for a read
	// (the server's reply lands in Data, len(Data) bytes).
	Write bool
	// Usr is the user message, at most MaxHdrSize minus the RTRS header.
	Usr []byte
	// Data is the data to write or the buffer to read into; at most the
	// session's MaxIOSize. A read without data (a flush) has none.
	Data []byte
	// Done is called on the queue's thread when the request has ended:
	// errno 0 or a negative errno from the server, or -ENOTCONN when no path
	// could carry it. Make it once (a method value), not per request.
	Done func(r *Request, errno int)
	// Tag is the caller's.
	Tag uint64

	id        int      // permit (chunk index) while held, else -1
	qc        *qconn   // connection carrying it, nil while waiting
	next      *Request // in one list at a time: a send queue or the waiting list
	frameLen  int      // header + payload bytes of its frame
	sent      int      // bytes of the frame written so far
	parts     [3][]byte
	failovers int
	start     int64 // monotonic ns at submission, for latency
}

// reqList is an intrusive FIFO of requests.
type reqList struct{ head, tail *Request }

func (l *reqList) push(r *Request) {
	r.next = nil
	if l.tail == nil {
		l.head = r
	} else {
		l.tail.next = r
	}
	l.tail = r
}

func (l *reqList) pushFront(r *Request) {
	r.next = l.head
	l.head = r
	if l.tail == nil {
		l.tail = r
	}
}

func (l *reqList) pop() *Request {
	r := l.head
	if r != nil {
		l.head = r.next
		if l.head == nil {
			l.tail = nil
		}
		r.next = nil
	}
	return r
}

func (l *reqList) empty() bool { return l.head == nil }

// iovecs fills iov with the parts of r's frame not yet sent and returns how
// many entries it used.
func (r *Request) iovecs(iov *[3]unix.Iovec) int {
	skip, n := r.sent, 0
	for _, p := range r.parts {
		if skip >= len(p) {
			skip -= len(p)
			continue
		}
		p = p[skip:]
		skip = 0
		iov[n].Base = &p[0]
		iov[n].SetLen(len(p))
		n++
	}
	return n
}
