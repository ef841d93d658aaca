package tcp

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// SpliceRead answers a read of len(io.Data) bytes with data read from fd
// at off that never passes through user memory: the read fills a pipe of
// the connection (splice from fd), and the pipe's pages go into the
// socket behind the answer's header (splice to the socket). Only when
// the read has succeeded in full does the header go out, so a failed
// read is answered with its errno, as Complete would answer it.
//
// fd must be opened with O_DIRECT: the pipe then holds pages of its own,
// not the page cache's, which later writes could change while the socket
// still refers to them.
//
// It returns false, having done nothing, where it cannot be used: a
// write, a read smaller than zeroCopyMin, a connection that is not TCP or
// whose pipe cannot be had; the caller then serves the request itself.
// True means the request is completed. Call it from HandleIO, before it
// returns, as the only answer to io.
func (io *ServerIO) SpliceRead(fd int, off int64) bool {
	n := len(io.Data)
	c := io.conn
	if io.Write || n < zeroCopyMin {
		return false
	}
	h, err := frame.IORspHeader(io.codec, io.id, 0, n)
	if err != nil {
		return false
	}
	c.wmu.Lock()
	p := c.splicePipe(n)
	if p == nil {
		c.wmu.Unlock()
		return false
	}
	if errno := p.fill(fd, off, n); errno != 0 {
		// What part of the read is in the pipe is not sent: the pipe goes.
		c.closePipe()
		c.wmu.Unlock()
		io.Complete(-int(errno))
		return true
	}
	sess := io.Sess
	h.MarshalTo(c.hdr[:])
	c.wbuf = append(c.wbuf, c.hdr[:]...)
	// The chunk holds no data of the answer: it is free before the answer
	// goes out (as in Complete). io is not read after this.
	io.busy.Store(false)
	err = c.sendSpliced(p, n)
	c.wbuf = c.wbuf[:0]
	if err != nil {
		c.closePipe() // it may hold data not sent; the connection goes too
	}
	c.wmu.Unlock()
	if err != nil {
		_ = c.nc.Close()
	}
	sess.Release()
	return true
}

// splicePipe is a connection's pipe for SpliceRead.
type splicePipe struct {
	r, w int
	// The answer being sent: what is left of the gathered bytes before
	// the data, of the data in the pipe, and the error that ended it.
	head  []byte
	left  int
	err   error
	write func(s uintptr) bool // sendStep, bound once
}

// splicePipe returns the connection's pipe, made at the first use with
// room for n bytes; nil where there is none (not a TCP connection, or the
// pipe could not be made that large). c.wmu is held.
func (c *ServerConn) splicePipe(n int) *splicePipe {
	if c.noSplice {
		return nil
	}
	if c.pipe != nil && c.pipeCap >= n {
		return c.pipe
	}
	c.closePipe()
	if c.raw == nil {
		tc, ok := c.nc.(*net.TCPConn)
		if !ok {
			c.noSplice = true
			return nil
		}
		raw, err := tc.SyscallConn()
		if err != nil {
			c.noSplice = true
			return nil
		}
		c.raw = raw
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil // out of descriptors: try again at the next read
	}
	size, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, n)
	if err != nil || size < n {
		unix.Close(fds[0])
		unix.Close(fds[1])
		c.noSplice = true // over the system's pipe size limit: it stays
		return nil
	}
	p := &splicePipe{r: fds[0], w: fds[1]}
	p.write = p.sendStep
	c.pipe, c.pipeCap = p, size
	return p
}

// closePipe closes the connection's pipe, if any; c.wmu is held.
func (c *ServerConn) closePipe() {
	if c.pipe != nil {
		unix.Close(c.pipe.r)
		unix.Close(c.pipe.w)
		c.pipe = nil
	}
}

// fill reads n bytes of fd at off into the empty pipe, which has room for
// them. It returns 0 or the errno of the read (EIO for an end of file
// before n bytes).
func (p *splicePipe) fill(fd int, off int64, n int) syscall.Errno {
	for n > 0 {
		k, err := unix.Splice(fd, &off, p.w, nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			var errno syscall.Errno
			if errors.As(err, &errno) {
				return errno
			}
			return syscall.EIO
		case k == 0:
			return syscall.EIO
		}
		n -= int(k)
	}
	return 0
}

// sendSpliced writes the gathered answers (ending with the header of the
// spliced one) and then the n bytes in the pipe to the socket, waiting
// for room in it as a write on the connection does. c.wmu is held.
func (c *ServerConn) sendSpliced(p *splicePipe, n int) error {
	p.head, p.left, p.err = c.wbuf, n, nil
	if err := c.raw.Write(p.write); err != nil {
		return err
	}
	return p.err
}

// sendStep is sendSpliced's step for syscall.RawConn.Write, made once per
// pipe (a closure per answer would allocate): false waits for room in
// the socket s.
func (p *splicePipe) sendStep(s uintptr) bool {
	for len(p.head) > 0 || p.left > 0 {
		var k int
		var err error
		if len(p.head) > 0 {
			// MSG_MORE: the header shares its segment with the data.
			k, err = unix.SendmsgN(int(s), p.head, nil, nil, unix.MSG_MORE|unix.MSG_NOSIGNAL)
		} else {
			var k64 int64
			k64, err = unix.Splice(p.r, nil, int(s), nil, p.left, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			if k = int(k64); err == nil && k == 0 {
				err = syscall.EPIPE
			}
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false
		case err != nil:
			p.err = err
			return true
		}
		if len(p.head) > 0 {
			p.head = p.head[k:]
		} else {
			p.left -= k
		}
	}
	p.head = nil
	return true
}
