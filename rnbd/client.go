package rnbd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/ublk"
)

// Client is an RNBD client session: an RTRS session whose per-CPU queues
// carry block requests and whose admin queue carries session info, open
// and close.
type Client struct {
	rc    *tcp.Client
	admin *tcp.ClientQueue
	ver   uint8
	done  chan error
}

// Dial opens an RNBD session over RTRS/TCP (cfg.AdminQueue is set here)
// and exchanges session info.
func Dial(ctx context.Context, cfg tcp.ClientConfig) (*Client, error) {
	cfg.AdminQueue = true
	rc, err := tcp.DialClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c := &Client{rc: rc, admin: rc.Admin(), done: make(chan error, 1)}
	go func() { c.done <- c.admin.Run(nil) }()
	buf := make([]byte, SessInfoRspSize)
	if err := c.call(ctx, "SESS_INFO", &SessInfo{Ver: ProtoVerMajor}, false, buf); err != nil {
		c.Close()
		return nil, err
	}
	var rsp SessInfoRsp
	if err := rsp.Unmarshal(buf); err != nil {
		c.Close()
		return nil, fmt.Errorf("rnbd: session info response: %w", err)
	}
	c.ver = min(rsp.Ver, ProtoVerMajor)
	return c, nil
}

// RTRS returns the underlying RTRS client (paths, statistics).
func (c *Client) RTRS() *tcp.Client { return c.rc }

// Close ends the session; map devices must be unmapped first.
func (c *Client) Close() error { return c.rc.Close() }

type marshaler interface {
	Size() int
	MarshalTo([]byte) (int, error)
}

// call sends one admin message and waits for its answer; for a read, the
// answer's data lands in data.
func (c *Client) call(ctx context.Context, what string, msg marshaler, write bool, data []byte) error {
	usr := make([]byte, msg.Size())
	if _, err := msg.MarshalTo(usr); err != nil {
		return fmt.Errorf("rnbd %s: %w", what, err)
	}
	done := make(chan int, 1)
	r := &tcp.Request{Write: write, Usr: usr, Data: data, Done: func(_ *tcp.Request, e int) { done <- e }}
	c.admin.Do(func(q *tcp.ClientQueue) {
		if err := q.Submit(r); err != nil {
			done <- -int(syscall.EINVAL)
		}
	})
	select {
	case e := <-done:
		if e != 0 {
			return fmt.Errorf("rnbd %s: server answered %w", what, syscall.Errno(-e))
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rnbd %s: %w", what, ctx.Err())
	}
}

// Device is a mapped RNBD device: a ublk device whose requests go to the
// server.
type Device struct {
	c      *Client
	id     uint32
	name   string
	mode   AccessMode
	geo    OpenRsp
	dev    *ublk.Device
	target *target
}

// MapOptions tune the local device.
type MapOptions struct {
	// Depth is the ublk queue depth; 0 means ublk.DefaultQueueDepth.
	Depth int
	// ID is the ublk device number wanted, -1 for any.
	ID int
}

// Map opens devName on the server and exposes it as a ublk device with the
// geometry the server reports, one ublk queue per RTRS queue.
func (c *Client) Map(ctx context.Context, ctrl *ublk.Control, devName string, mode AccessMode, opts MapOptions) (*Device, error) {
	m := Open{AccessMode: mode}
	if err := m.SetDevName(devName); err != nil {
		return nil, fmt.Errorf("rnbd: device path %q: %w", devName, syscall.EINVAL)
	}
	buf := make([]byte, OpenRspSize)
	if err := c.call(ctx, "OPEN "+devName, &m, false, buf); err != nil {
		return nil, err
	}
	d := &Device{c: c, name: devName, mode: mode}
	if err := d.geo.Unmarshal(buf); err != nil {
		return nil, fmt.Errorf("rnbd: open response: %w", err)
	}
	d.id = d.geo.DeviceID
	if err := d.geo.Check(); err != nil {
		d.close(ctx)
		return nil, fmt.Errorf("rnbd: open response for %s: %w", devName, err)
	}
	uopts := d.ublkOptions(opts)
	d.target = &target{d: d}
	dev, err := ublk.Create(ctrl, uopts, d.target)
	if err != nil {
		d.close(ctx)
		return nil, err
	}
	d.dev = dev
	return d, nil
}

func (d *Device) ublkOptions(opts MapOptions) ublk.Options {
	g := &d.geo
	maxIO := d.c.rc.Params().MaxIOSize &^ 4095
	if maxIO > ublk.DefaultMaxIOBytes {
		maxIO = ublk.DefaultMaxIOBytes
	}
	o := ublk.Options{
		ID:                    opts.ID,
		Queues:                d.c.rc.Queues(),
		Depth:                 opts.Depth,
		MaxIOBytes:            maxIO,
		Size:                  g.NSectors << 9,
		LogicalBlockSize:      uint32(g.LogicalBlockSize),
		PhysicalBlockSize:     uint32(g.PhysicalBlockSize),
		ReadOnly:              d.mode == AccessRO,
		VolatileCache:         g.CachePolicy&CacheWriteback != 0,
		FUA:                   g.CachePolicy&CacheFUA != 0,
		MaxDiscardSectors:     g.MaxDiscardSectors,
		MaxWriteZeroesSectors: g.MaxWriteZeroesSectors,
		DiscardGranularity:    g.DiscardGranularity,
	}
	if o.PhysicalBlockSize < o.LogicalBlockSize {
		o.PhysicalBlockSize = o.LogicalBlockSize
	}
	return o
}

// UblkDevice returns the local ublk device.
func (d *Device) UblkDevice() *ublk.Device { return d.dev }

// ID returns the server's device id.
func (d *Device) ID() uint32 { return d.id }

// Unmap deletes the local device (requests still queued fail) and closes
// the device on the server.
func (d *Device) Unmap(ctx context.Context) error {
	err := d.dev.Delete()
	if cerr := d.close(ctx); err == nil {
		err = cerr
	}
	return err
}

func (d *Device) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := d.c.call(ctx, "CLOSE", &Close{DeviceID: d.id}, true, nil)
	if errors.Is(err, syscall.ENOTCONN) {
		return nil
	}
	return err
}
