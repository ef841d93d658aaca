package tcp

import (
	"fmt"
	"net"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp/internal/frame"
)

// ctrlConn is a TCP connection during the handshake: it writes and reads
// control frames, each under a deadline.
type ctrlConn struct {
	nc      net.Conn
	dec     *frame.Decoder
	timeout time.Duration
	wbuf    [frame.HeaderSize + frame.MaxCtrlLen]byte
}

func newCtrlConn(nc net.Conn, dir frame.Direction, timeout time.Duration) *ctrlConn {
	if timeout <= 0 {
		timeout = rtrs.ConnectTimeout
	}
	return &ctrlConn{nc: nc, dec: frame.NewDecoder(dir), timeout: timeout}
}

// writeCtrl sends m as a control frame of kind k.
func (c *ctrlConn) writeCtrl(k frame.CtrlKind, m frame.Marshaler) error {
	n, err := frame.PutCtrl(c.wbuf[:], k, m)
	if err != nil {
		return err
	}
	if err := c.nc.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return fmt.Errorf("rtrs/tcp: send %v: %w", k, err)
	}
	if _, err := c.nc.Write(c.wbuf[:n]); err != nil {
		return fmt.Errorf("rtrs/tcp: send %v to %v: %w", k, c.nc.RemoteAddr(), err)
	}
	return c.nc.SetWriteDeadline(time.Time{})
}

// readCtrl waits for the control frame of kind want and returns its
// payload, valid until the next read.
func (c *ctrlConn) readCtrl(want frame.CtrlKind) ([]byte, error) {
	if err := c.nc.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
		return nil, fmt.Errorf("rtrs/tcp: wait for %v: %w", want, err)
	}
	f, err := c.dec.ReadFrame(c.nc)
	if err != nil {
		return nil, fmt.Errorf("rtrs/tcp: wait for %v from %v: %w", want, c.nc.RemoteAddr(), err)
	}
	if f.Ctrl != want {
		return nil, fmt.Errorf("rtrs/tcp: got %v (imm %#08x) from %v, want %v: %w", f.Ctrl, f.Header.Imm, c.nc.RemoteAddr(), want, rtrs.ErrBadType)
	}
	if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return f.Payload, nil
}
