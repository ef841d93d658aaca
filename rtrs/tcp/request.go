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
