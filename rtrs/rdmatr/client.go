package rdmatr

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/clientq"
	"github.com/urnbd/urnbd/rtrs/internal/session"
)

// PathAddr is one path: Dst is the server's "ip:port" (or "ip", port
// rtrs.DefaultPort), Src optionally the local IP to connect from.
type PathAddr = rtrs.PathAddr

// ClientPathInfo is a snapshot of a client path.
type ClientPathInfo = rtrs.ClientPathInfo

// ClientConfig describes a client session over RDMA: the session layer's
// configuration and the client's registered memory.
type ClientConfig struct {
	rtrs.ClientConfig
	// Region is the client's registered memory: the Data of every Request
	// must lie inside it, because the RDMA device reads write data from it
	// and the server RDMA-writes read data into it. It must be memory that
	// never moves, from mmap(2) (unix.Mmap), not the Go heap; the caller
	// keeps it mapped until Close has returned. If nil, DialClient maps
	// RegionSize bytes itself (see Client.Region) and unmaps them at Close.
	// The region is registered (local write, remote write) with the
	// device of every path; one rkey per path (and part, see
	// RegionPartSize) serves all read buffers.
	Region     []byte
	RegionSize int
	// RegionPartSize, if not 0, splits the region into parts of that many
	// bytes (the last may be shorter), each registered only once
	// Client.RegisterPart asks for it: registered memory is pinned, and
	// a caller that hands parts out one by one (RNBD: one per mapped
	// device) then pins only what it uses. A request's Data must lie
	// within one registered part. If 0, the whole region is registered.
	RegionPartSize int
}

type sessionAPI = session.API

// Client is an RTRS client session over RDMA: its paths, each with one IO
// connection per queue, and the queues that carry requests. Its path
// methods (AddPath, RemovePath, DisconnectPath, ReconnectPath, Paths,
// SetPolicy, SetMaxReconnectAttempts, ResumeIO, Params) are the session
// layer's, the same on every transport.
type Client struct {
	sessionAPI
	s         *session.Session
	params    Params            // the session's, fixed by the first connect (Start)
	queueSet  *clientq.QueueSet // permits, shared by the queues
	queues    []*ClientQueue    // set by Start, before the session layer tells them anything
	region    []byte
	ownRegion bool
	partSize  int           // bytes per region part: RegionPartSize, or the whole region
	parts     []atomic.Bool // parts[k]: part k is registered on every set in pcs
	hdr       []byte        // queue_depth × max_hdr_size: per permit, user message + RTRS header

	mu  sync.Mutex              // pcs and the parts' registrations
	pcs map[*pathConns]struct{} // connection sets whose PD holds the parts' registrations
	// live holds, by path index, the connection set that carries requests
	// (CompletionQueues).
	live [rtrs.MaxPathsNum]atomic.Pointer[pathConns]
}

// transport is the Client as the session layer sees it.
type transport Client

// DialClient opens a session: it connects every path (at least one must
// connect within the timeout; the others keep trying in the background,
// as the kernel client does) and returns the client with its queues, which
// the caller runs (ClientQueue.Run).
func DialClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	scfg, err := cfg.ClientConfig.Checked()
	if err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr client: %w", err)
	}
	if cfg.TLS != nil {
		return nil, fmt.Errorf("rtrs/rdmatr client: TLS is for the TCP transport; over RDMA the key (RTRS authentication) is what there is: %w", syscall.EINVAL)
	}
	c := &Client{region: cfg.Region}
	if c.region == nil {
		if cfg.RegionSize <= 0 {
			return nil, fmt.Errorf("rtrs/rdmatr: no Region and no RegionSize: %w", syscall.EINVAL)
		}
		r, err := mmapRegion(cfg.RegionSize)
		if err != nil {
			return nil, err
		}
		c.region, c.ownRegion = r, true
	}
	if err := c.splitRegion(cfg.RegionPartSize); err != nil {
		c.freeMem()
		return nil, err
	}
	if c.s, err = session.New(scfg, (*transport)(c)); err != nil {
		c.freeMem()
		return nil, fmt.Errorf("rtrs/rdmatr client: %w", err)
	}
	c.sessionAPI = c.s.API()
	if err := c.s.Dial(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("rtrs/rdmatr client: %w", err)
	}
	return c, nil
}

// Region returns the registered memory region requests' Data must lie in.
func (c *Client) Region() []byte { return c.region }

// Queues returns the number of per-CPU queues (the admin queue excluded).
func (c *Client) Queues() int { return c.s.Config().Queues }

// Queue returns queue i (0..Queues-1, and the admin queue after them).
func (c *Client) Queue(i int) *ClientQueue { return c.queues[i] }

// Admin returns the admin queue, or nil without ClientConfig.AdminQueue.
func (c *Client) Admin() *ClientQueue {
	if !c.s.Config().AdminQueue {
		return nil
	}
	return c.queues[c.s.Config().Queues]
}

// Permits returns the session's permit pool.
func (c *Client) Permits() *rtrs.Permits { return c.queueSet.Permits() }

// Close ends the session: every path is disconnected and freed, requests
// still waiting fail with -ENOTCONN, and the queues' Run loops return.
// Call it from outside the queues' threads.
func (c *Client) Close() error {
	if !c.s.Close() {
		return nil
	}
	for _, q := range c.queues {
		q.core.PostClose()
	}
	for _, q := range c.queues {
		if q.started.Load() {
			<-q.exited
		}
		q.core.CloseMailbox(nil)
	}
	c.freeMem()
	return nil
}

func (c *Client) freeMem() {
	if c.ownRegion {
		munmap(c.region)
		c.region = nil
	}
	munmap(c.hdr)
	c.hdr = nil
}

// CheckPath implements session.Transport.
func (t *transport) CheckPath(a PathAddr) error {
	if _, err := parseAddr(a.Dst, rtrs.DefaultPort); err != nil {
		return err
	}
	if a.Src != "" {
		if _, err := parseAddr(a.Src, 0); err != nil {
			return err
		}
	}
	return nil
}

// Start implements session.Transport: the headers' memory and the queues,
// sized by the first connect's parameters.
func (t *transport) Start(params Params) (err error) {
	c := (*Client)(t)
	cfg := c.s.Config()
	if c.hdr, err = mmapRegion(params.QueueDepth * params.MaxHdrSize); err != nil {
		return err
	}
	c.params = params
	c.queueSet = clientq.NewQueueSet(rtrs.NewPermits(params.QueueDepth))
	qs := make([]*ClientQueue, 0, cfg.NumQueues())
	for i := 0; i < cfg.NumQueues(); i++ {
		q, err := newClientQueue(c, i)
		if err != nil {
			for _, q := range qs {
				q.core.CloseMailbox(nil)
			}
			return err
		}
		qs = append(qs, q)
	}
	if cfg.AdminQueue {
		qs[cfg.Queues].core.SetAdmin()
	}
	c.queues = qs
	return nil
}

// WakeQueues implements session.Transport.
func (t *transport) WakeQueues() {
	for _, q := range t.queues {
		q.core.PostRetry()
	}
}

// Fenced implements session.Transport.
func (t *transport) Fenced(p *session.Path, gen uint64) {
	for _, q := range t.queues {
		q.core.PostFenced(p, gen)
	}
}

// SetPolicy implements session.Transport.
func (t *transport) SetPolicy(pol rtrs.MPPolicy) {
	for _, q := range t.queues {
		q.core.PostPolicy(pol)
	}
}
