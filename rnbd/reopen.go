package rnbd

import (
	"context"
	"errors"
	"fmt"
	"log"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// When a session loses all its paths and gets one back, the server may be
// a new one (a restart) that knows neither the session's devices nor their
// ids; ids are given in open order, so a stale id could even name another
// device. The kernel's client reopens its devices then (remap_devs in
// rnbd-clt.c). So does this one, and more strictly: the RTRS session holds
// IO after such a reconnect (rtrs.Link), the client exchanges session info
// and reopens every mapped device, rewrites the device id in the requests
// that wait, and only then lets IO go. A device the server no longer has
// (or has with another size) gets an id that names nothing, so its I/O
// fails rather than reaching anything else.

// invalidDeviceID is the id of a device that could not be reopened.
const invalidDeviceID = ^uint32(0)

// reopenTimeout bounds one attempt at reopening a session's devices.
const reopenTimeout = 10 * time.Second

// onLink receives the RTRS session's link events, on a path goroutine.
func (c *Client) onLink(ev rtrs.LinkEvent, gen uint64) {
	if ev != rtrs.LinkReconnected {
		c.down.Store(true)
		return
	}
	c.relinkGen.Store(gen)
	select {
	case c.relink <- struct{}{}:
	default:
	}
}

// relinkLoop reopens the session's devices after each reconnect, trying
// again every second until it works or the session reconnects anew.
func (c *Client) relinkLoop() {
	for {
		select {
		case <-c.closing:
			return
		case <-c.relink:
		}
		last := ""
		for {
			gen := c.relinkGen.Load()
			err := c.reopen(gen)
			if err == nil {
				c.t.resume(gen)
				if gen == c.relinkGen.Load() {
					c.down.Store(false)
				}
				break
			}
			if err.Error() != last { // not every second
				last = err.Error()
				log.Printf("rnbd: session reconnected; reopening its devices: %v; trying again every second", err)
			}
			select {
			case <-c.closing:
				return
			case <-c.relink:
			case <-time.After(time.Second):
			}
		}
	}
}

// reopen sets the session up again on the server: session info, then an
// open of every mapped device.
func (c *Client) reopen(gen uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), reopenTimeout)
	defer cancel()
	if err := c.sessInfo(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	devs := make([]*Device, 0, len(c.devs))
	for d := range c.devs {
		devs = append(devs, d)
	}
	c.mu.Unlock()
	for _, d := range devs {
		if err := d.reopen(ctx); err != nil {
			return err
		}
	}
	return nil
}

// reopen opens the device again and gives its queues the new id. An error
// means the attempt must be repeated (the session is down again); a server
// that refuses the device leaves it with invalidDeviceID.
func (d *Device) reopen(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.unmapped {
		return nil
	}
	id, err := d.openAgain(ctx)
	if err != nil {
		return err
	}
	if old := d.id.Swap(id); old != id {
		log.Printf("rnbd: %s: reopened after the session reconnected: device id %d (was %d)", d.name, int32(id), old)
	}
	for _, q := range d.queues {
		done := make(chan struct{})
		q.rq.q.Do(func() { q.setDeviceID(id); close(done) })
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// errBadOpenRsp wraps an open response that does not decode or check.
var errBadOpenRsp = errors.New("bad open response")

// sendOpen sends the device's open again on its session and returns the
// server's answer: a repeated open by a session opens nothing new, and the
// answer carries the device's id and geometry now (reopen, Resize).
func (d *Device) sendOpen(ctx context.Context) (OpenRsp, error) {
	var rsp OpenRsp
	m := Open{AccessMode: d.mode}
	if err := m.SetDevName(d.name); err != nil {
		return rsp, err
	}
	buf, err := d.c.call(ctx, "OPEN "+d.name, &m, false, OpenRspSize)
	if err != nil {
		return rsp, err
	}
	if err := rsp.Unmarshal(buf); err != nil {
		return rsp, fmt.Errorf("%w: %w", errBadOpenRsp, err)
	}
	if err := rsp.Check(); err != nil {
		return rsp, fmt.Errorf("%w: %w", errBadOpenRsp, err)
	}
	return rsp, nil
}

// openAgain sends the device's open; it returns invalidDeviceID if the
// server refused it or answered another geometry.
func (d *Device) openAgain(ctx context.Context) (uint32, error) {
	rsp, err := d.sendOpen(ctx)
	var errno syscall.Errno
	switch {
	case errors.Is(err, errBadOpenRsp):
		log.Printf("rnbd: %s: %v after the session reconnected: its I/O fails", d.name, err)
		return invalidDeviceID, nil
	case errors.As(err, &errno) && errno != syscall.ENOTCONN:
		log.Printf("rnbd: %s: the server refused to reopen it after the session reconnected (%v): its I/O fails", d.name, err)
		return invalidDeviceID, nil
	case err != nil:
		return 0, err
	}
	if rsp.NSectors != d.geo.NSectors || rsp.LogicalBlockSize != d.geo.LogicalBlockSize {
		log.Printf("rnbd: %s: reopened with %d sectors of %d bytes, was %d of %d: its I/O fails", d.name,
			rsp.NSectors, rsp.LogicalBlockSize, d.geo.NSectors, d.geo.LogicalBlockSize)
		return invalidDeviceID, nil
	}
	return rsp.DeviceID, nil
}
