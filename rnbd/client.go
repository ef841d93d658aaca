package rnbd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/ublk"
)

// Client is an RNBD client session: an RTRS session (over TCP or RDMA)
// whose per-CPU queues carry block requests and whose admin queue carries
// session info, open and close.
type Client struct {
	t   *transport
	ver uint8

	mu   sync.Mutex
	devs map[*Device]struct{} // mapped, for reopening after a reconnect

	// relink is signalled when the session reconnected after losing all
	// its paths; relinkGen is that reconnect (rtrs.Link).
	relink    chan struct{}
	relinkGen atomic.Uint64
	// down is set from the loss of the session's last path until its
	// devices are reopened.
	down      atomic.Bool
	closing   chan struct{}
	closeOnce sync.Once
}

func newClient() *Client {
	return &Client{devs: map[*Device]struct{}{}, relink: make(chan struct{}, 1), closing: make(chan struct{})}
}

// DialOption sets an option of a session being dialled.
type DialOption func(*dialOptions)

type dialOptions struct {
	maxDevices int
}

// DefaultMaxDevices is how many devices a session maps at a time unless
// WithMaxDevices says otherwise.
const DefaultMaxDevices = 4

// MaxDevicesLimit bounds WithMaxDevices.
const MaxDevicesLimit = 64

// WithMaxDevices sets how many devices the session maps at a time (1 to
// MaxDevicesLimit; default DefaultMaxDevices). Each device has a block of
// per-CPU RTRS connections of its own, made when the session is dialled,
// so each one more costs a connection per CPU and path; over RDMA a
// block's buffers are registered only when a device first uses it.
func WithMaxDevices(n int) DialOption { return func(o *dialOptions) { o.maxDevices = n } }

func applyDialOptions(opts []DialOption) (dialOptions, error) {
	o := dialOptions{maxDevices: DefaultMaxDevices}
	for _, f := range opts {
		f(&o)
	}
	if o.maxDevices < 1 || o.maxDevices > MaxDevicesLimit {
		return o, fmt.Errorf("rnbd: %d devices per session, want 1..%d: %w", o.maxDevices, MaxDevicesLimit, syscall.EINVAL)
	}
	return o, nil
}

// DialTCP opens an RNBD session over RTRS/TCP and exchanges session info.
func DialTCP(ctx context.Context, cfg rtrs.ClientConfig, opts ...DialOption) (*Client, error) {
	o, err := applyDialOptions(opts)
	if err != nil {
		return nil, err
	}
	c := newClient()
	cfg.OnLinkEvent, cfg.HoldIOOnReconnect = c.onLink, true
	if c.t, err = dialTCP(ctx, cfg, o.maxDevices); err != nil {
		return nil, err
	}
	return c.start(ctx)
}

// DialRDMA opens an RNBD session over RTRS/RDMA and exchanges session
// info. The session registers the memory its devices' buffers come from;
// its devices have a depth of at most 128.
func DialRDMA(ctx context.Context, cfg rtrs.ClientConfig, opts ...DialOption) (*Client, error) {
	o, err := applyDialOptions(opts)
	if err != nil {
		return nil, err
	}
	c := newClient()
	cfg.OnLinkEvent, cfg.HoldIOOnReconnect = c.onLink, true
	if c.t, err = dialRDMA(ctx, cfg, o.maxDevices); err != nil {
		return nil, err
	}
	return c.start(ctx)
}

func (c *Client) start(ctx context.Context) (*Client, error) {
	if err := c.sessInfo(ctx); err != nil {
		c.Close()
		return nil, err
	}
	go c.relinkLoop()
	return c, nil
}

// sessInfo exchanges session info, which the server needs before opens.
func (c *Client) sessInfo(ctx context.Context) error {
	buf, err := c.call(ctx, "SESS_INFO", &SessInfo{Ver: ProtoVerMajor}, false, SessInfoRspSize)
	if err != nil {
		return err
	}
	var rsp SessInfoRsp
	if err := rsp.Unmarshal(buf); err != nil {
		return fmt.Errorf("rnbd: session info response: %w", err)
	}
	c.ver = min(rsp.Ver, ProtoVerMajor)
	return nil
}

// Paths describes the session's RTRS paths and their statistics.
func (c *Client) Paths() []PathStatus { return c.t.paths() }

// Close ends the session; mapped devices must be unmapped first.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	return c.t.close()
}

// MaxDevices returns how many devices the session maps at a time.
func (c *Client) MaxDevices() int { return c.t.maxDevices() }

// Queues returns the number of queues that each device of the session
// has: one per CPU unless the session was dialled with fewer or more.
func (c *Client) Queues() int { return c.t.queues() }

type marshaler interface {
	Size() int
	MarshalTo([]byte) (int, error)
}

// call sends one admin message and waits for its answer; a read returns
// respLen bytes of answer.
func (c *Client) call(ctx context.Context, what string, msg marshaler, write bool, respLen int) ([]byte, error) {
	usr := make([]byte, msg.Size())
	if _, err := msg.MarshalTo(usr); err != nil {
		return nil, fmt.Errorf("rnbd %s: %w", what, err)
	}
	e, resp, err := c.t.call(ctx, write, usr, respLen)
	if err != nil {
		return nil, fmt.Errorf("rnbd %s: %w", what, err)
	}
	if e != 0 {
		return nil, fmt.Errorf("rnbd %s: server answered %w", what, syscall.Errno(-e))
	}
	return resp, nil
}

// Device is a mapped RNBD device: a ublk device whose requests go to the
// server.
type Device struct {
	c      *Client
	id     atomic.Uint32 // the server's id; changes when the device is reopened
	name   string
	mode   AccessMode
	geo    OpenRsp
	dev    *ublk.Device
	target *target
	block  int // the transport's queue block for this device
	// zeroCopy: the device serves requests from their own pages where the
	// transport can (MapOptions.ZeroCopy).
	zeroCopy bool

	mu       sync.Mutex
	queues   []*queue // the target's, once their threads made them
	unmapped bool
}

// MapOptions tune the local device.
type MapOptions struct {
	// Depth is the ublk queue depth; 0 means ublk.DefaultQueueDepth.
	Depth int
	// ID is the ublk device number wanted, -1 for any.
	ID int
	// ZeroCopy asks, over TCP, for the requests' own pages where the
	// driver offers them (ublk.FlagAutoBufReg, Linux 6.16): read data is
	// then received into them and write data copied out of them, instead
	// of the driver copying each request through the tag's buffer. Over
	// RDMA it does nothing. Off by default: in the lab it measured slower
	// (docs/benchmarks.md).
	ZeroCopy bool
}

// Map opens devName on the server and exposes it as a ublk device with the
// geometry the server reports, one ublk queue per RTRS queue.
func (c *Client) Map(ctx context.Context, ctrl *ublk.Control, devName string, mode AccessMode, opts MapOptions) (*Device, error) {
	d, err := c.open(ctx, devName, mode)
	if err != nil {
		return nil, err
	}
	d.zeroCopy = opts.ZeroCopy
	uopts := d.ublkOptions(opts)
	if uopts.Depth == 0 {
		uopts.Depth = ublk.DefaultQueueDepth
	}
	if uopts.Buffers, err = d.acquire(ctx, uopts.Queues*uopts.Depth*uopts.MaxIOBytes); err != nil {
		return nil, err
	}
	return d.serve(ctx, func() (*ublk.Device, error) { return ublk.Create(ctrl, uopts, d.target) })
}

// Recover serves again ublk device id, which a client that died mapped from
// devName (ublk user recovery: the device waited, quiesced, and the I/O
// it had in flight is issued again). The server's device must be at least
// as large as the ublk device, and the session have as many queues.
func (c *Client) Recover(ctx context.Context, ctrl *ublk.Control, id uint32, devName string, mode AccessMode) (*Device, error) {
	info, err := ctrl.DevInfo(id)
	if err != nil {
		return nil, err
	}
	if int(info.NrHWQueues) != c.t.queues() {
		return nil, fmt.Errorf("rnbd: recover %s: it has %d queues, the session %d: %w", ublk.BlockPath(id), info.NrHWQueues, c.t.queues(), syscall.EINVAL)
	}
	d, err := c.open(ctx, devName, mode)
	if err != nil {
		return nil, err
	}
	// Smaller is fine: Resize may have set the device below the server's.
	if sectors, err := blockSectors(id); err != nil || sectors > d.geo.NSectors {
		d.close(ctx)
		return nil, fmt.Errorf("rnbd: recover %s: %d sectors (%v), more than %s on the server, %d: %w", ublk.BlockPath(id), sectors, err, devName, d.geo.NSectors, syscall.EINVAL)
	}
	buffers, err := d.acquire(ctx, int(info.NrHWQueues)*int(info.QueueDepth)*int(info.MaxIOBufBytes))
	if err != nil {
		return nil, err
	}
	// The device keeps the data path it was made with.
	d.zeroCopy = info.Flags&ublk.FlagAutoBufReg != 0
	return d.serve(ctx, func() (*ublk.Device, error) { return ublk.Recover(ctrl, id, d.target, buffers) })
}

// blockSectors returns the size of ublk block device id in 512-byte sectors.
func blockSectors(id uint32) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/ublkb%d/size", id))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// open opens devName on the server.
func (c *Client) open(ctx context.Context, devName string, mode AccessMode) (*Device, error) {
	m := Open{AccessMode: mode}
	if err := m.SetDevName(devName); err != nil {
		return nil, fmt.Errorf("rnbd: device path %q: %w", devName, syscall.EINVAL)
	}
	buf, err := c.call(ctx, "OPEN "+devName, &m, false, OpenRspSize)
	if err != nil {
		return nil, err
	}
	d := &Device{c: c, name: devName, mode: mode}
	if err := d.geo.Unmarshal(buf); err != nil {
		return nil, fmt.Errorf("rnbd: open response: %w", err)
	}
	d.id.Store(d.geo.DeviceID)
	if err := d.geo.Check(); err != nil {
		d.close(ctx)
		return nil, fmt.Errorf("rnbd: open response for %s: %w", devName, err)
	}
	d.target = &target{d: d}
	return d, nil
}

// acquire reserves the device's block of queues and its buffers; on error
// the device is closed on the server.
func (d *Device) acquire(ctx context.Context, bufBytes int) ([]byte, error) {
	block, buffers, err := d.c.t.acquire(bufBytes)
	if err != nil {
		d.close(ctx)
		return nil, err
	}
	d.block = block
	return buffers, nil
}

// serve makes the ublk device with start and registers the mapping; on
// error it undoes acquire and open.
func (d *Device) serve(ctx context.Context, start func() (*ublk.Device, error)) (*Device, error) {
	dev, err := start()
	if err != nil {
		d.c.t.release(d.block)
		d.close(ctx)
		return nil, err
	}
	d.dev = dev
	d.c.mu.Lock()
	d.c.devs[d] = struct{}{}
	d.c.mu.Unlock()
	return d, nil
}

func (d *Device) ublkOptions(opts MapOptions) ublk.Options {
	g := &d.geo
	maxIO := d.c.t.maxIOSize() &^ 4095
	if maxIO > ublk.DefaultMaxIOBytes {
		maxIO = ublk.DefaultMaxIOBytes
	}
	o := ublk.Options{
		ID:                    opts.ID,
		Queues:                d.c.t.queues(),
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
func (d *Device) ID() uint32 { return d.id.Load() }

// Open reports whether the device is open on the server: not while its
// session has no path, nor until the device is reopened after that, nor
// when the server refused to reopen it (the kernel's sysfs state "open"
// against "closed").
func (d *Device) Open() bool { return !d.c.down.Load() && d.id.Load() != invalidDeviceID }

// Unmap deletes the local device (requests still queued fail) and closes
// the device on the server.
func (d *Device) Unmap(ctx context.Context) error {
	d.detach()
	err := d.dev.Delete()
	d.c.t.release(d.block)
	if cerr := d.close(ctx); err == nil {
		err = cerr
	}
	return err
}

// detach takes the device off its client: no reopen after a reconnect
// touches it from then on.
func (d *Device) detach() {
	d.c.mu.Lock()
	delete(d.c.devs, d)
	d.c.mu.Unlock()
	d.mu.Lock() // waits for a reopen of the device to end
	d.unmapped = true
	d.mu.Unlock()
}

func (d *Device) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := d.c.call(ctx, "CLOSE", &Close{DeviceID: d.id.Load()}, true, 0)
	if errors.Is(err, syscall.ENOTCONN) {
		return nil
	}
	return err
}
