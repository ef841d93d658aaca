package frame

import (
	"errors"
	"fmt"
	"io"

	"github.com/urnbd/urnbd/rtrs"
)

// Frame is a decoded frame. It is owned by the Decoder that returned it and
// valid until the next call to that Decoder.
type Frame struct {
	Header
	// Imm is the decoded immediate of an IO or heartbeat frame (zero for a
	// control frame).
	Imm rtrs.Imm
	// Ctrl is the kind of a control frame, 0 otherwise.
	Ctrl CtrlKind
	// Payload holds the Len payload bytes, in the buffer the Placer gave (or
	// the Decoder's own buffer).
	Payload []byte
}

// IsCtrl reports whether f is a control (handshake) frame.
func (f *Frame) IsCtrl() bool { return f.Ctrl != 0 }

// Placer chooses where a frame's payload goes, so that it is read straight
// into its final buffer: a server puts an IO_REQ payload into chunk
// f.Imm.BufID at f.Off, a client puts read data into the buffer of request
// f.Imm.BufID. Place is called once the header is validated and only for
// frames with a payload; it returns a buffer of at least f.Len bytes or an
// error, which fails the decoder. Returning nil uses the Decoder's own
// buffer.
type Placer interface {
	Place(f *Frame) ([]byte, error)
}

// Decoder decodes the frames of one direction of a connection. It works
// incrementally (Feed) on any split of the byte stream, or reads whole
// frames from an io.Reader (ReadFrame), and does not allocate per frame.
// After an error it keeps returning that error: the connection must be
// closed. A Decoder is not safe for concurrent use.
type Decoder struct {
	dir      Direction
	codec    rtrs.ImmCodec
	hasCodec bool
	placer   Placer
	own      []byte // default payload buffer

	hdr   [HeaderSize]byte
	nhdr  int
	inPay bool // header done, payload pending
	npay  int
	f     Frame
	err   error
}

// NewDecoder returns a decoder for frames travelling in direction dir. Until
// SetSession it accepts only control frames.
func NewDecoder(dir Direction) *Decoder {
	return &Decoder{dir: dir, own: make([]byte, MaxCtrlLen)}
}

// SetSession fixes the session parameters from the connection response:
// from now on IO and heartbeat frames are accepted, validated against c
// (queue depth, chunk size). It grows the Decoder's own payload buffer to
// the chunk size unless p is set; p (may be nil) places payloads.
func (d *Decoder) SetSession(c rtrs.ImmCodec, p Placer) {
	d.codec, d.hasCodec, d.placer = c, true, p
	if p == nil && len(d.own) < c.ChunkSize() {
		d.own = make([]byte, c.ChunkSize())
	}
}

// Err returns the error that stopped the decoder, or nil.
func (d *Decoder) Err() error { return d.err }

// Feed consumes bytes of the stream from p until a frame is complete or p
// is used up. It returns the number of bytes consumed and the completed
// frame, or nil if more bytes are needed. Call it again with p[n:] to go on.
func (d *Decoder) Feed(p []byte) (n int, f *Frame, err error) {
	if d.err != nil {
		return 0, nil, d.err
	}
	if !d.inPay {
		c := copy(d.hdr[d.nhdr:], p)
		d.nhdr += c
		n += c
		if d.nhdr < HeaderSize {
			return n, nil, nil
		}
		if err := d.startFrame(); err != nil {
			return n, nil, err
		}
	}
	c := copy(d.f.Payload[d.npay:], p[n:])
	d.npay += c
	n += c
	if d.npay < len(d.f.Payload) {
		return n, nil, nil
	}
	return n, d.finish(), nil
}

// PayloadTail returns the part of the current frame's payload that has not
// arrived yet, or nil between frames and inside a header. A caller that
// reads the stream itself may read the next bytes straight into it, saving
// a copy of large payloads, and then report them with Filled.
func (d *Decoder) PayloadTail() []byte {
	if d.err != nil || !d.inPay {
		return nil
	}
	return d.f.Payload[d.npay:]
}

// Filled records that n bytes of the stream were read into PayloadTail.
// It returns the frame if that completed it, else nil.
func (d *Decoder) Filled(n int) (*Frame, error) {
	if d.err != nil {
		return nil, d.err
	}
	if !d.inPay || n < 0 || n > len(d.f.Payload)-d.npay {
		return nil, d.fail(fmt.Errorf("rtrs/tcp: %d bytes filled into a payload tail of %d", n, len(d.PayloadTail())))
	}
	d.npay += n
	if d.npay < len(d.f.Payload) {
		return nil, nil
	}
	return d.finish(), nil
}

// Pending reports whether a frame has been started but not completed.
func (d *Decoder) Pending() bool { return d.nhdr > 0 || d.inPay }

// End tells the decoder the stream has ended. It returns an error wrapping
// rtrs.ErrTruncated if a frame was cut off, the decoder's error if it had
// failed, and nil at a frame boundary.
func (d *Decoder) End() error {
	if d.err != nil {
		return d.err
	}
	if d.Pending() {
		return d.fail(frameErr(rtrs.ErrTruncated, "stream", "ended inside a frame (%d of %d header bytes, %d of %d payload bytes)",
			d.nhdr, HeaderSize, d.npay, len(d.f.Payload)))
	}
	return nil
}

// ReadFrame reads one whole frame from r, the payload straight into its
// buffer. At a clean end of stream before a frame it returns io.EOF; a
// stream that ends inside a frame gives an error wrapping rtrs.ErrTruncated.
// It must not be mixed with Feed on a partly decoded frame.
func (d *Decoder) ReadFrame(r io.Reader) (*Frame, error) {
	if d.err != nil {
		return nil, d.err
	}
	if d.Pending() {
		return nil, d.fail(errors.New("rtrs/tcp: ReadFrame called inside a frame"))
	}
	if n, err := io.ReadFull(r, d.hdr[:]); err != nil {
		d.nhdr = n
		return nil, d.readErr(err)
	}
	d.nhdr = HeaderSize
	if err := d.startFrame(); err != nil {
		return nil, err
	}
	if n, err := io.ReadFull(r, d.f.Payload); err != nil {
		d.npay = n
		return nil, d.readErr(err)
	}
	return d.finish(), nil
}

func (d *Decoder) readErr(err error) error {
	if err == io.EOF && !d.Pending() {
		return io.EOF // not sticky: nothing was lost
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return d.End()
	}
	return d.fail(fmt.Errorf("rtrs/tcp: read frame: %w", err))
}

func (d *Decoder) fail(err error) error {
	d.err = err
	return err
}

// startFrame validates the complete header in d.hdr and sets up the payload
// buffer.
func (d *Decoder) startFrame() error {
	var h Header
	_ = h.Unmarshal(d.hdr[:])
	f, err := d.check(h)
	if err != nil {
		return d.fail(err)
	}
	d.f = f
	d.inPay, d.npay = true, 0
	if h.Len == 0 {
		d.f.Payload = d.own[:0]
		return nil
	}
	var buf []byte
	if d.placer != nil && !f.IsCtrl() {
		if buf, err = d.placer.Place(&d.f); err != nil {
			return d.fail(fmt.Errorf("rtrs/tcp: place payload of %d bytes: %w", h.Len, err))
		}
	}
	if buf == nil {
		buf = d.own
	}
	if uint64(len(buf)) < uint64(h.Len) {
		return d.fail(frameErr(rtrs.ErrShortBuffer, "payload", "buffer of %d bytes for %d", len(buf), h.Len))
	}
	d.f.Payload = buf[:h.Len:h.Len]
	return nil
}

func (d *Decoder) finish() *Frame {
	d.nhdr, d.inPay, d.npay = 0, false, 0
	return &d.f
}

// check validates a header for this decoder's direction and session.
func (d *Decoder) check(h Header) (Frame, error) {
	t, payload := rtrs.SplitImm(h.Imm)
	if t == ImmCtrl {
		k := CtrlKind(payload)
		ok := false
		switch d.dir {
		case ToServer:
			ok = k == CtrlConnReq || k == CtrlInfoReq || k == CtrlFenceReq
		case ToClient:
			ok = k == CtrlConnRsp || k == CtrlInfoRsp || k == CtrlFenceRsp
		}
		if !ok {
			return Frame{}, frameErr(rtrs.ErrBadType, "ctrl", "%v not allowed %v (imm %#08x)", k, d.dir, h.Imm)
		}
		if h.Off != 0 {
			return Frame{}, frameErr(rtrs.ErrOutOfRange, "ctrl", "offset %d, want 0", h.Off)
		}
		if h.Len > MaxCtrlLen {
			return Frame{}, frameErr(rtrs.ErrMsgSize, "ctrl", "%v of %d bytes, max %d", k, h.Len, MaxCtrlLen)
		}
		return Frame{Header: h, Ctrl: k}, nil
	}
	if !d.hasCodec {
		return Frame{}, frameErr(rtrs.ErrBadType, "io", "%v frame before the session parameters are known (imm %#08x)", t, h.Imm)
	}
	im, err := d.codec.Decode(h.Imm)
	if err != nil {
		return Frame{}, fmt.Errorf("rtrs/tcp frame: %w", err)
	}
	chunk := uint32(d.codec.ChunkSize())
	switch {
	case im.Type == rtrs.ImmIOReq && d.dir == ToServer:
		if err := checkIOReq(h, im.Off, chunk); err != nil {
			return Frame{}, err
		}
	case im.Type == rtrs.ImmIORsp && d.dir == ToClient:
		if h.Off != 0 {
			return Frame{}, frameErr(rtrs.ErrOutOfRange, "io_rsp", "offset %d, want 0", h.Off)
		}
		if h.Len > chunk {
			return Frame{}, frameErr(rtrs.ErrMsgSize, "io_rsp", "%d data bytes, chunk size %d", h.Len, chunk)
		}
		if im.Errno != 0 && h.Len != 0 {
			return Frame{}, frameErr(rtrs.ErrOutOfRange, "io_rsp", "%d data bytes with errno %d", h.Len, im.Errno)
		}
	case im.Type == rtrs.ImmHBMsg || im.Type == rtrs.ImmHBAck:
		if h.Len != 0 || h.Off != 0 {
			return Frame{}, frameErr(rtrs.ErrOutOfRange, "heartbeat", "len %d off %d, want 0 0", h.Len, h.Off)
		}
	default:
		return Frame{}, frameErr(rtrs.ErrBadType, "io", "%v not allowed %v (imm %#08x)", im.Type, d.dir, h.Imm)
	}
	return Frame{Header: h, Imm: im}, nil
}
