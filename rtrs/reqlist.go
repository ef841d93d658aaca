package rtrs

// ReqList is an intrusive FIFO of requests, linked through the requests
// themselves so that queueing never allocates. A request is in at most one
// list at a time (a queue's waiting list or a connection's send queue);
// the zero value is an empty list. It is not safe for concurrent use.
type ReqList struct{ head, tail *Request }

// Push appends r.
func (l *ReqList) Push(r *Request) {
	r.next = nil
	if l.tail == nil {
		l.head = r
	} else {
		l.tail.next = r
	}
	l.tail = r
}

// PushFront puts r first, e.g. back where Pop took it from when it still
// cannot go.
func (l *ReqList) PushFront(r *Request) {
	r.next = l.head
	l.head = r
	if l.tail == nil {
		l.tail = r
	}
}

// Pop removes and returns the first request, or nil.
func (l *ReqList) Pop() *Request {
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

// Front returns the first request without removing it, or nil.
func (l *ReqList) Front() *Request { return l.head }

// After returns the request after r, which must be in l, or nil.
func (l *ReqList) After(r *Request) *Request { return r.next }

// Empty reports whether the list holds no request.
func (l *ReqList) Empty() bool { return l.head == nil }

// Clear empties the list without touching its requests (their links are
// reset when they are pushed again).
func (l *ReqList) Clear() { l.head, l.tail = nil, nil }
