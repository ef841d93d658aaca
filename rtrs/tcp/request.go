package tcp

import (
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
)

// Request is one IO request of a client (see rtrs.Request). Its Data may
// be any memory.
type Request = rtrs.Request

// sendFrame is the TCP frame of the request holding one permit: the parts it
// is written from and how much of it has been written.
type sendFrame struct {
	parts [3][]byte // header (+ read request), write data, write request
	len   int       // header + payload bytes
	sent  int       // bytes written so far
}

// iovecs fills iov with the parts of the frame not yet sent and returns
// how many entries it used.
func (f *sendFrame) iovecs(iov *[3]unix.Iovec) int {
	skip, n := f.sent, 0
	for _, p := range f.parts {
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

// permitRing is a connection's frames to write, by permit, in order. A
// request is queued on one connection at a time, so it never holds more
// than the session's queue depth.
type permitRing struct {
	ids  []int32
	head int
	n    int
}

func newPermitRing(depth int) permitRing { return permitRing{ids: make([]int32, depth)} }

func (r *permitRing) len() int    { return r.n }
func (r *permitRing) empty() bool { return r.n == 0 }
func (r *permitRing) clear()      { r.head, r.n = 0, 0 }

// at returns the i-th permit from the front.
func (r *permitRing) at(i int) int { return int(r.ids[(r.head+i)%len(r.ids)]) }

func (r *permitRing) push(id int) {
	if r.n == len(r.ids) {
		panic("rtrs/tcp: a connection's send queue holds more requests than the queue depth")
	}
	r.ids[(r.head+r.n)%len(r.ids)] = int32(id)
	r.n++
}

func (r *permitRing) pop() {
	r.head = (r.head + 1) % len(r.ids)
	r.n--
}
