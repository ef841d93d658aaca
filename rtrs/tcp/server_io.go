package tcp

import (
	"bufio"
	"fmt"
	"net"
	"runtime"

	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// ServerHandler serves the IO requests that clients send to a Server.
type ServerHandler interface {
	// HandleIO starts request io. The handler completes it with
	// io.Complete, at once or later from any goroutine; io and its slices
	// stay valid until then.
	HandleIO(io *ServerIO)
}

// ServerIO is one IO request on the server, living in its chunk.
type ServerIO struct {
	// Sess is the client session; it outlives the request.
	Sess *rtrs.ServerSession
	// Session is the client session's name.
	Session string
	// Write is true for a write (data client→server), false for a read.
	Write bool
	// Usr is the user (RNBD) message.
	Usr []byte
	// Data is the written data of a write, or for a read the buffer to fill,
	// as long as the client asked for. A read's handler may instead point
	// Data at memory of its own that holds the answer (no longer than
	// asked): Complete sends it before it returns, so the memory must
	// stay unchanged only until then.
	Data []byte
	// Local is the server address of the connection the request came on
	// (which path carried it).
	Local net.Addr

	id     uint32
	busy   atomic.Bool                // from Place to the end of Complete
	holder atomic.Pointer[ServerConn] // the connection that placed the request holding busy
	conn   *ServerConn
	codec  rtrs.ImmCodec
	hdr    [frame.HeaderSize]byte
}

// Complete answers the request: errno is 0 or a negative errno. A
// successful read sends Data back. Errors sending the answer close the
// connection; the client fails the request over.
func (io *ServerIO) Complete(errno int) {
	sess := io.Sess // io may be taken again once busy is cleared
	n := 0
	if errno == 0 && !io.Write {
		n = len(io.Data)
	}
	h, err := frame.IORspHeader(io.codec, io.id, errno, n)
	if err != nil {
		// errno out of the 9-bit range: answer EIO rather than nothing.
		h, _ = frame.IORspHeader(io.codec, io.id, -int(syscall.EIO), 0)
		n = 0
	}
	h.MarshalTo(io.hdr[:])
	c := io.conn
	c.wmu.Lock()
	err = nil
	if n >= zeroCopyMin {
		// Large read data goes from the chunk to the socket, behind the
		// answers gathered so far, in one writev. The chunk can be freed
		// first: the client has the answer only once its last byte was
		// copied from the chunk into the socket. io itself is not read
		// after that (a resend of the request may take it).
		c.hdr = io.hdr
		c.bufs = append(c.iovArr[:0], c.wbuf, c.hdr[:], io.Data[:n])
		io.busy.Store(false)
		_, err = c.bufs.WriteTo(c.nc)
		c.wbuf = c.wbuf[:0]
	} else {
		c.wbuf = append(append(c.wbuf, io.hdr[:]...), io.Data[:n]...)
		// The answer is copied: the chunk is free (the client reuses it
		// only once the answer arrived; Place waits for this store).
		io.busy.Store(false)
		if !c.inLoop || len(c.wbuf) >= flushThreshold {
			err = c.flushLocked()
		}
	}
	c.wmu.Unlock()
	if err != nil {
		_ = c.nc.Close()
	}
	sess.Release()
}

// zeroCopyMin is the read answer size from which Complete writes the data
// from the chunk instead of copying it behind the gathered answers.
const zeroCopyMin = 16 << 10

// flushThreshold is how many answer bytes a connection gathers before it
// writes them even in the middle of a batch of requests.
const flushThreshold = 256 << 10

// flushLocked writes the gathered answers; c.wmu is held.
func (c *ServerConn) flushLocked() error {
	if len(c.wbuf) == 0 {
		return nil
	}
	_, err := c.nc.Write(c.wbuf)
	c.wbuf = c.wbuf[:0]
	return err
}

// setInLoop says whether the serving goroutine is in a batch of requests:
// answers completed meanwhile are gathered and written once at its end.
// Leaving the batch writes them.
func (c *ServerConn) setInLoop(in bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.inLoop = in
	if in {
		return nil
	}
	return c.flushLocked()
}

// sessionIO is the IO state of a server session over TCP: its chunks
// (the session layer's pool) and one ServerIO per chunk.
type sessionIO struct {
	sess  *rtrs.ServerSession
	mem   []byte
	ios   []ServerIO
	chunk int
}

// sessionIO returns the TCP IO state of sess, made on first use and
// dropped when the session layer frees the session; s.mu is held.
func (s *Server) sessionIO(sess *rtrs.ServerSession) *sessionIO {
	if sio := s.sios[sess]; sio != nil {
		return sio
	}
	sio := &sessionIO{sess: sess, chunk: s.cfg.ChunkSize, mem: sess.Pool(), ios: make([]ServerIO, s.cfg.QueueDepth)}
	s.sios[sess] = sio
	sess.OnFree(func() {
		s.mu.Lock()
		delete(s.sios, sess)
		s.mu.Unlock()
	})
	return sio
}

// Place puts an IO_REQ payload into its chunk at the frame's offset, once
// the chunk's previous request has been answered (see waitChunk).
func (cp *connPlacer) Place(f *frame.Frame) ([]byte, error) {
	sio := cp.sio
	io := &sio.ios[f.Imm.BufID]
	if !io.busy.CompareAndSwap(false, true) {
		if err := cp.waitChunk(io, f.Imm.BufID); err != nil {
			return nil, err
		}
	}
	io.holder.Store(cp.conn)
	cp.placed = int(f.Imm.BufID)
	base := int(f.Imm.BufID) * sio.chunk
	return sio.mem[base+int(f.Off) : base+int(f.Off)+int(f.Len)], nil
}

// chunkWait bounds how long a request waits for the stale request of
// another connection that holds its chunk.
const chunkWait = rtrs.ConnectTimeout

// waitChunk takes io's chunk once its request is answered. A client reuses
// a chunk only after the answer arrived, so a request of the same
// connection finds at most the last steps of Complete still running: a
// short wait, and a longer one is the client's error. A request of another
// connection, though, can be the stale copy of this very request, sent on
// a path that failed: the client resent it here with the same chunk while
// the server still runs the stale one. This request must not touch the
// chunk before the stale one is done with it, however long its backend
// I/O takes.
func (cp *connPlacer) waitChunk(io *ServerIO, id uint32) error {
	var deadline time.Time
	for i := 0; !io.busy.CompareAndSwap(false, true); i++ {
		if i < 1000 {
			runtime.Gosched()
			continue
		}
		if io.holder.Load() == cp.conn {
			return fmt.Errorf("rtrs/tcp server: chunk %d reused while its request is in flight: %w", id, rtrs.ErrOutOfRange)
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(chunkWait)
		} else if time.Now().After(deadline) {
			return fmt.Errorf("rtrs/tcp server: chunk %d still held by a request of another connection after %v: %w", id, chunkWait, syscall.ETIMEDOUT)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil
}

// connPlacer places one connection's frames and remembers the chunk of the
// frame being read, to free it if the frame never completes.
type connPlacer struct {
	sio    *sessionIO
	conn   *ServerConn
	placed int
}

// release frees the chunk of a frame that will not be served.
func (cp *connPlacer) release() {
	if cp.placed >= 0 {
		cp.sio.ios[cp.placed].busy.Store(false)
		cp.placed = -1
	}
}

// serveIO reads the frames of one connection until it fails: IO requests
// go to the handler, heartbeats are answered. A silent service connection
// (cid 0) closes its path. An IO request on a path that has not completed
// session establishment closes the path; one on a path closed meanwhile
// (its client resends it elsewhere) is dropped unread.
func (s *Server) serveIO(c *ServerConn) {
	p := c.path
	s.mu.Lock()
	sio := p.sio // set under s.mu by the path's first connection
	s.mu.Unlock()
	if sio == nil {
		return
	}
	// The connection reads payloads into the pool: it holds the session.
	sio.sess.Hold()
	defer sio.sess.Release()
	dec := frame.NewDecoder(frame.ToServer)
	cp := &connPlacer{sio: sio, conn: c, placed: -1}
	dec.SetSession(s.codec, cp)
	r := bufio.NewReaderSize(c.nc, 64<<10)
	idle := s.cfg.SilenceLimit()
	defer s.closePath(p)
	defer func() {
		c.wmu.Lock()
		c.closePipe()
		c.wmu.Unlock()
	}()
	var ack [frame.HeaderSize]byte
	frame.HeartbeatHeader(true).MarshalTo(ack[:])
	c.wbuf = make([]byte, 0, flushThreshold+sio.chunk+frame.HeaderSize)
	// inBatch mirrors c.inLoop, which only this goroutine sets: c.wmu is
	// taken once per batch, not per frame, so that reading requests does not
	// wait behind each answer that a completing request is writing.
	inBatch := false
	for {
		if inBatch && r.Buffered() == 0 {
			// Nothing more to read without blocking: end of the batch.
			inBatch = false
			if err := c.setInLoop(false); err != nil {
				cp.release()
				return
			}
		}
		if c.cid == 0 {
			_ = c.nc.SetReadDeadline(time.Now().Add(idle))
		}
		f, err := dec.ReadFrame(r)
		if err != nil {
			cp.release()
			return
		}
		if !inBatch {
			inBatch = true
			_ = c.setInLoop(true)
		}
		if f.IsCtrl() {
			// After the handshake only a fence, on cid 0.
			if c.cid != 0 || f.Ctrl != frame.CtrlFenceReq || !s.fence(c, f.Payload) {
				return
			}
			continue
		}
		switch f.Imm.Type {
		case rtrs.ImmHBMsg:
			c.wmu.Lock()
			c.wbuf = append(c.wbuf, ack[:]...)
			c.wmu.Unlock()
		case rtrs.ImmHBAck:
		case rtrs.ImmIOReq:
			if !p.core.Serving() {
				if p.core.State() == rtrs.ServerPathConnecting {
					s.logf("path %v → %v cid %d: IO request before session establishment; closing the path",
						p.core.Src(), p.core.Dst(), c.cid)
				}
				cp.release()
				return
			}
			err := s.startIO(sio, c, f)
			if err != nil {
				cp.release()
				return
			}
			cp.placed = -1
		default:
			return
		}
	}
}

// fence handles a FenceReq on cid 0 of c's path: the path it names is
// closed before the answer goes out. False closes c's path.
func (s *Server) fence(c *ServerConn, b []byte) bool {
	var req rtrs.FenceReq
	if err := req.Unmarshal(b); err != nil {
		s.logf("path %v → %v: %v", c.path.core.Src(), c.path.core.Dst(), err)
		return false
	}
	rsp := rtrs.FenceRsp{SessUUID: req.SessUUID}
	target, err := s.tab.FencePath(c.path.core, req.SessUUID)
	switch {
	case err != nil:
		rsp.Errno = -int16(rtrs.ErrnoOr(err, syscall.EINVAL))
	case target != nil:
		target.Owner().ClosePath()
	}
	var out [frame.HeaderSize + rtrs.FenceRspSize]byte
	n, err := frame.PutCtrl(out[:], frame.CtrlFenceRsp, &rsp)
	if err != nil {
		return false
	}
	c.wmu.Lock()
	c.wbuf = append(c.wbuf, out[:n]...)
	c.wmu.Unlock()
	return true
}

func (s *Server) startIO(sio *sessionIO, c *ServerConn, f *frame.Frame) error {
	id := f.Imm.BufID
	base := int(id) * sio.chunk
	req, err := rtrs.ParseIOReq(sio.mem[base:base+sio.chunk], f.Imm.Off)
	if err != nil {
		return fmt.Errorf("rtrs/tcp server: request in chunk %d: %w", id, err)
	}
	io := &sio.ios[id]
	sess := sio.sess
	io.Sess, io.Session, io.id, io.conn, io.codec, io.Usr, io.Local = sess, sess.Name(), id, c, s.codec, req.Usr, c.nc.LocalAddr()
	// Complete releases it.
	sess.Hold()
	switch req.Type {
	case rtrs.MsgWrite:
		io.Write, io.Data = true, req.Data
	default:
		// A read names where the data goes: over TCP only its length
		// matters. The kernel server takes exactly one descriptor (or
		// none, for a flush); the reply is built in the chunk's data area.
		io.Write = false
		n := 0
		switch req.Descs.Len() {
		case 0:
		case rtrs.ServerMaxReadSGCnt:
			n = int(req.Descs.At(0).Len)
		default:
			sess.Release()
			return fmt.Errorf("rtrs/tcp server: read with %d descriptors: %w", req.Descs.Len(), rtrs.ErrOutOfRange)
		}
		if n > len(req.Data) {
			io.Data = nil
			io.Complete(-int(syscall.EINVAL))
			return nil
		}
		io.Data = req.Data[:n]
	}
	s.cfg.Handler.HandleIO(io)
	return nil
}
