package rdmatr

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
)

// PathAddr is one path: Dst is the server's "ip:port" (or "ip", port
// rtrs.DefaultPort), Src optionally the local IP to connect from.
type PathAddr = rtrs.PathAddr

// Path states of a client path (ClientPathInfo.State names them).
const (
	PathStateConnecting   = rtrs.PathStateConnecting
	PathStateConnected    = rtrs.PathStateConnected
	PathStateReconnecting = rtrs.PathStateReconnecting
	PathStateDisconnected = rtrs.PathStateDisconnected
	PathStateRemoved      = rtrs.PathStateRemoved
)

// PathStateName returns "connecting", "connected", ... (rtrs.PathStateName).
func PathStateName(s int32) string { return rtrs.PathStateName(s) }

// ClientConfig describes a client session.
type ClientConfig struct {
	// SessName is the session name (rtrs.CheckSessName).
	SessName string
	// Paths are the session's paths.
	Paths []PathAddr
	// Queues is the number of per-CPU queues, and so of IO connections per
	// path (cid 1..Queues; cid 0 is the service connection); default the
	// number of CPUs.
	Queues int
	// Policy picks the path of each request.
	Policy rtrs.MPPolicy
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
	// MaxReconnectAttempts bounds the reconnects of a path after it failed:
	// -1 forever (the kernel's default), 0 none.
	MaxReconnectAttempts int
	// ReconnectDelay is waited before each reconnect attempt; default
	// rtrs.ReconnectBackoff.
	ReconnectDelay time.Duration
	// HeartbeatInterval and MissedHeartbeats: a path whose server sends
	// nothing for about Interval × (Missed+2) is failed; defaults
	// rtrs.HBInterval and rtrs.HBMissedMax.
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
	// Timeout bounds address and route resolution, each connection and
	// the INFO exchange; default rtrs.ConnectTimeout.
	Timeout time.Duration
	// Logf, if set, receives a line for every path failure and why.
	Logf func(format string, args ...any)
	// OnLinkEvent, if set, is told when the session loses its last
	// connected path and when a path comes back after that, with the
	// number of such reconnects (rtrs.Link). It runs on a path goroutine
	// and must not block.
	OnLinkEvent func(ev rtrs.LinkEvent, gen uint64)
	// HoldIOOnReconnect: after such a reconnect the queues send no
	// request until ResumeIO (queues marked with ClientQueue.Unheld
	// excepted), so that the user can set up again what a restarted
	// server lost (RNBD reopens its devices).
	HoldIOOnReconnect bool
}

// Client is an RTRS client session over RDMA: its paths, each with one IO
// connection per queue, and the queues that carry requests.
type Client struct {
	cfg       ClientConfig
	params    Params
	queueSet  *rtrs.QueueSet // permits, shared by the queues
	pathsUUID rtrs.UUID
	link      *rtrs.Link
	region    []byte
	ownRegion bool
	partSize  int           // bytes per region part: RegionPartSize, or the whole region
	parts     []atomic.Bool // parts[k]: part k is registered on every set in pcs
	hdr       []byte        // queue_depth × max_hdr_size: per permit, user message + RTRS header
	queues    []*ClientQueue

	mu      sync.Mutex
	paths   []*clientPath
	pcs     map[*pathConns]struct{} // connection sets whose PD holds the parts' registrations
	adopted bool
	ready   chan struct{}
	closed  atomic.Bool
	wg      sync.WaitGroup
	// maxRecon is max_reconnect_attempts (ClientConfig.MaxReconnectAttempts,
	// SetMaxReconnectAttempts), read by the path goroutines.
	maxRecon rtrs.ReconnectLimit
}

// clientPath is one path of the session, run by its own goroutine.
type clientPath struct {
	c        *Client
	idx      int
	addr     PathAddr
	src, dst netip.AddrPort
	uuid     rtrs.UUID
	state    rtrs.PathState
	stats    *rtrs.ClientPathStats
	hbMissed atomic.Int32
	rtt      atomic.Int64
	connErr  rtrs.ConnectError // why the last connect attempt failed
	reconCnt uint16
	wakeFD   int
	cmd      atomic.Int32 // the user's pending command (cmdNone, cmdReconnect, ...)
	first    chan error   // first connect outcome, once
	cur      *pathConns   // owned by the path goroutine
	// live is cur while it carries requests, for CompletionQueues.
	live atomic.Pointer[pathConns]
	// connSeq numbers the path's connects (pathConns.gen); path goroutine.
	connSeq uint64
	// fencedGen is the newest connect of the path that the server is known
	// to have closed: the queues resend the requests of that connect or an
	// older one only then (rtrs.Unfenced).
	fencedGen rtrs.FencedGen
	// fenceMu guards fenceQ, the fence requests of other paths for this
	// path's service loop to send.
	fenceMu sync.Mutex
	fenceQ  []fenceCall
}

// fenceCall is a fence request handed to another path's service loop.
type fenceCall struct {
	target rtrs.UUID
	done   chan error // buffered
}

// pathConns are the connections and registrations of one connect of a
// path; a reconnect makes new ones.
type pathConns struct {
	p      *clientPath
	gen    uint64 // clientPath.connSeq of this connect
	ch     *rdma.EventChannel
	pd     *rdma.PD
	svc    *conn
	io     []*conn // by queue
	params Params
	chunks []rtrs.RemoteChunk
	partMR []*rdma.MR // by region part; set under Client.mu, read by queues once the part is registered
	hdrMR  *rdma.MR
	info   []byte
	infoMR *rdma.MR
	failed atomic.Bool
	// claims[i] is set while queue i holds, or may still take, its
	// connection of this set; holders counts the set claims, and released
	// is closed when the last one goes (pathConns.release).
	claims   []atomic.Bool
	holders  atomic.Int32
	released chan struct{}
	hbSent   time.Time
	cqs      []CQInfo // the CQs' handles (CompletionQueues)
}

// Usable, Inflight, Latency implement rtrs.PathLoad.
func (p *clientPath) Usable() bool    { return p.state.Load() == PathStateConnected }
func (p *clientPath) Inflight() int64 { return p.stats.Inflight() }
func (p *clientPath) Latency() int64  { return p.rtt.Load() }

// DialClient opens a session: it connects every path (at least one must
// connect within the timeout; the others keep trying in the background,
// as the kernel client does) and returns the client with its queues, which
// the caller runs (ClientQueue.Run).
func DialClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.Queues <= 0 {
		cfg.Queues = runtime.NumCPU()
	}
	if err := rtrs.CheckClientSession(cfg.SessName, len(cfg.Paths), cfg.Queues+1, cfg.MaxReconnectAttempts); err != nil {
		return nil, fmt.Errorf("rtrs/rdmatr client: %w", err)
	}
	t := rtrs.ClientTimers{ReconnectDelay: cfg.ReconnectDelay, HeartbeatInterval: cfg.HeartbeatInterval,
		MissedHeartbeats: cfg.MissedHeartbeats, Timeout: cfg.Timeout}.WithDefaults()
	cfg.ReconnectDelay, cfg.HeartbeatInterval, cfg.MissedHeartbeats, cfg.Timeout = t.ReconnectDelay, t.HeartbeatInterval, t.MissedHeartbeats, t.Timeout
	c := &Client{cfg: cfg, ready: make(chan struct{}), region: cfg.Region, link: rtrs.NewLink(cfg.HoldIOOnReconnect, cfg.OnLinkEvent)}
	_ = c.maxRecon.Set(cfg.MaxReconnectAttempts) // checked by CheckClientSession
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
	rand.Read(c.pathsUUID[:])
	for i, a := range cfg.Paths {
		p, err := c.newPath(i, a)
		if err != nil {
			c.closePaths()
			c.freeMem()
			return nil, err
		}
		c.paths = append(c.paths, p)
	}
	for _, p := range c.paths {
		c.wg.Add(1)
		go p.run()
	}
	var errs []error
	for _, p := range c.paths {
		var err error
		select {
		case err = <-p.first:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil {
			<-c.ready
			return c, nil
		}
		errs = append(errs, fmt.Errorf("path %v: %w", p.addr, err))
	}
	c.Close()
	return nil, errors.Join(errs...)
}

func (c *Client) newPath(i int, a PathAddr) (*clientPath, error) {
	p := &clientPath{c: c, idx: i, addr: a, stats: rtrs.NewClientPathStats(0), first: make(chan error, 1)}
	p.state.Bind(c.link)
	var err error
	if p.dst, err = parseAddr(a.Dst, rtrs.DefaultPort); err != nil {
		return nil, err
	}
	if a.Src != "" {
		if p.src, err = parseAddr(a.Src, 0); err != nil {
			return nil, err
		}
	}
	rand.Read(p.uuid[:])
	if p.wakeFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, err
	}
	return p, nil
}

// Params returns the session parameters the server announced.
func (c *Client) Params() Params { return c.params }

// Region returns the registered memory region requests' Data must lie in.
func (c *Client) Region() []byte { return c.region }

// Queues returns the number of queues.
func (c *Client) Queues() int { return len(c.queues) }

// Queue returns queue i (0..Queues-1).
func (c *Client) Queue(i int) *ClientQueue { return c.queues[i] }

// ResumeIO lets the queues send again after reconnect gen
// (ClientConfig.HoldIOOnReconnect). It does nothing for an older
// reconnect than the last.
func (c *Client) ResumeIO(gen uint64) {
	if c.link.Resume(gen) {
		c.wakeQueues()
	}
}

// Permits returns the session's permit pool.
func (c *Client) Permits() *rtrs.Permits { return c.queueSet.Permits() }

// ClientPathInfo is a snapshot of a client path.
type ClientPathInfo = rtrs.ClientPathInfo

// Paths returns a snapshot of the session's paths.
func (c *Client) Paths() []ClientPathInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ClientPathInfo, len(c.paths))
	for i, p := range c.paths {
		out[i] = ClientPathInfo{Index: i, Addr: p.addr, State: PathStateName(p.state.Load()), RTT: time.Duration(p.rtt.Load()),
			LastError: p.connErr.String(), Stats: p.stats}
	}
	return out
}

// SetPolicy changes the multipath policy.
func (c *Client) SetPolicy(pol rtrs.MPPolicy) {
	for _, q := range c.queues {
		q.post(qmsg{kind: msgPolicy, policy: pol})
	}
}

// Close ends the session: every path is disconnected and freed, requests
// still waiting fail with -ENOTCONN, and the queues' Run loops return.
// Call it from outside the queues' threads.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.closePaths()
	c.wg.Wait()
	for _, q := range c.queues {
		q.post(qmsg{kind: msgClose})
	}
	for _, q := range c.queues {
		if q.started.Load() {
			<-q.exited
		}
		q.mbox.Close()
	}
	for _, p := range c.paths {
		unix.Close(p.wakeFD)
	}
	c.freeMem()
	return nil
}

// anyHope reports whether some path carries requests or may again.
func (c *Client) anyHope() bool {
	if c.closed.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.paths {
		if rtrs.PathHasHope(p.state.Load()) {
			return true
		}
	}
	return false
}

// closePaths marks the client closed and wakes every path goroutine so
// that it ends. AddPath, under the same mutex, adds no path after it.
func (c *Client) closePaths() {
	c.closed.Store(true)
	c.mu.Lock()
	paths := append([]*clientPath(nil), c.paths...)
	c.mu.Unlock()
	for _, p := range paths {
		p.wake()
	}
}

func (c *Client) freeMem() {
	if c.ownRegion {
		munmap(c.region)
		c.region = nil
	}
	munmap(c.hdr)
	c.hdr = nil
}

func (p *clientPath) wake() {
	one := [8]byte{1}
	unix.Write(p.wakeFD, one[:])
}

// sleep waits d (plus a little jitter, as the kernel) before a reconnect
// attempt; a user command or Close cuts it short.
func (p *clientPath) sleep(d time.Duration) {
	d += time.Duration(time.Now().UnixNano()%int64(rtrs.ReconnectSeed/time.Millisecond)) * time.Millisecond
	deadline := time.Now().Add(d)
	for !p.c.closed.Load() && p.cmd.Load() == cmdNone {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		waitFd(p.wakeFD, left)
		var b [8]byte
		unix.Read(p.wakeFD, b[:])
	}
}

// run connects the path, serves it, reconnects it after failures (up to
// max_reconnect_attempts in a row, then it stays disconnected) and
// follows the user's commands, until the path is removed or the client
// closes.
func (p *clientPath) run() {
	c := p.c
	defer c.wg.Done()
	firstDone := false
	report := func(err error) {
		if !firstDone {
			firstDone = true
			p.first <- err
		}
	}
	defer func() { report(errors.New("rtrs/rdmatr: client closed or path removed")) }()
	attempts, lastErr := 0, ""
	for !c.closed.Load() {
		switch p.takeCmd() {
		case cmdRemove:
			p.settle(PathStateRemoved)
			return
		case cmdDisconnect:
			if !p.parked() {
				return
			}
			attempts = 0
		case cmdReconnect:
			attempts = 0
		}
		pc, err := p.connect()
		if err == nil {
			err = c.adopt(pc)
		}
		p.connErr.Set(err)
		if err != nil {
			if pc != nil {
				pc.destroy()
			}
			report(err)
			p.stats.ReconnectFailed()
			attempts++
			if l := c.cfg.Logf; l != nil && err.Error() != lastErr {
				lastErr = err.Error() // a new reason, not every retry
				l("rtrs/rdmatr client path %v: connect attempt %d: %v", p.addr, attempts, err)
			}
			if c.maxRecon.Reached(attempts) {
				if l := c.cfg.Logf; l != nil {
					l("rtrs/rdmatr client path %v: giving up after %d attempts: %v", p.addr, attempts, err)
				}
				if !p.parked() {
					return
				}
				attempts = 0
				continue
			}
			p.state.Store(PathStateReconnecting)
			p.sleep(c.cfg.ReconnectDelay)
			continue
		}
		attempts, lastErr = 0, ""
		p.stats.ReconnectSucceeded()
		// The server took this connect: it has closed the path's earlier
		// ones, whose requests may go again now.
		p.connSeq++
		pc.gen = p.connSeq
		p.markFenced(pc.gen - 1)
		p.cur = pc
		pc.cqs = pc.cqInfos()
		p.live.Store(pc)
		p.hbMissed.Store(0)
		p.state.Store(PathStateConnected)
		report(nil)
		p.attach(pc)
		p.serve(pc)
		p.state.Store(PathStateReconnecting)
		p.live.Store(nil)
		p.teardown(pc)
		p.cur = nil
		if c.fencing() && !c.closed.Load() {
			c.wg.Add(1)
			go p.fenceLoop(pc.gen)
		}
		c.wakeQueues()
		if c.closed.Load() {
			break
		}
		if p.cmd.Load() != cmdNone {
			continue // handled at the top; a reconnect goes at once, as the kernel's
		}
		if c.maxRecon.Reached(0) {
			if !p.parked() {
				return
			}
			continue
		}
		p.sleep(c.cfg.ReconnectDelay)
	}
	p.state.Store(PathStateDisconnected)
}

// connect establishes the path as the kernel client does: cids
// 0..Queues one after another, then INFO_REQ/INFO_RSP on cid 0.
func (p *clientPath) connect() (_ *pathConns, err error) {
	c := p.c
	pc := &pathConns{p: p}
	defer func() {
		if err != nil {
			pc.destroy()
		}
	}()
	if pc.ch, err = rdma.NewEventChannel(); err != nil {
		return nil, err
	}
	if err = pc.ch.SetNonblock(true); err != nil {
		return nil, err
	}
	p.reconCnt++
	to := c.cfg.Timeout
	cidNum := c.cfg.Queues + 1
	for cid := 0; cid < cidNum; cid++ {
		id, err := pc.ch.NewID(rdma.PSTCP)
		if err != nil {
			return pc, err
		}
		if err := id.ResolveAddr(p.src, p.dst, to); err != nil {
			id.Destroy()
			return pc, err
		}
		if _, err := expectCM(pc.ch, rdma.EventAddrResolved, to); err != nil {
			id.Destroy()
			return pc, err
		}
		if err := id.ResolveRoute(to); err != nil {
			id.Destroy()
			return pc, err
		}
		if _, err := expectCM(pc.ch, rdma.EventRouteResolved, to); err != nil {
			id.Destroy()
			return pc, err
		}
		if pc.pd == nil {
			if pc.pd, err = id.Context().AllocPD(); err != nil {
				id.Destroy()
				return pc, err
			}
		}
		sendWR, recvWR := 2*rtrs.ServiceConQueueDepth+2, 2*rtrs.ServiceConQueueDepth+2
		if cid > 0 {
			qd := pc.params.QueueDepth
			sendWR, recvWR = 2*qd+2, 2*qd+2
		}
		cn, err := newConn(id, pc.pd, uint16(cid), sendWR, recvWR, 0, cid == 0)
		if err != nil {
			id.Destroy()
			return pc, err
		}
		if cid == 0 {
			pc.svc = cn
		} else {
			pc.io = append(pc.io, cn)
		}
		req := rtrs.ConnReq{CID: uint16(cid), CIDNum: uint16(cidNum), ReconCnt: p.reconCnt,
			SessUUID: p.uuid, PathsUUID: c.pathsUUID, FirstConn: true, Fence: true}
		var b [rtrs.ConnReqSize]byte
		req.MarshalTo(b[:])
		if err := id.Connect(rdma.ConnParam{PrivateData: b[:], RetryCount: 7, RNRRetryCount: 7}); err != nil {
			return pc, err
		}
		ev, err := waitCM(pc.ch, to)
		if err != nil {
			return pc, err
		}
		var rsp rtrs.ConnRsp
		switch ev.Type {
		case rdma.EventEstablished:
		case rdma.EventRejected:
			if len(ev.PrivateData) >= rtrs.ConnRspSize && rsp.Unmarshal(ev.PrivateData) == nil && rsp.Errno < 0 {
				return pc, fmt.Errorf("rtrs/rdmatr: cid %d refused: %w", cid, syscall.Errno(-rsp.Errno))
			}
			return pc, fmt.Errorf("rtrs/rdmatr: cid %d rejected (status %d): %w", cid, ev.Status, syscall.ECONNRESET)
		default:
			return pc, fmt.Errorf("rtrs/rdmatr: cid %d: %v (status %d): %w", cid, ev.Type, ev.Status, syscall.ECONNRESET)
		}
		if err := rsp.Unmarshal(ev.PrivateData); err != nil || rsp.Errno != 0 {
			return pc, fmt.Errorf("rtrs/rdmatr: cid %d conn_rsp: %v: %w", cid, err, syscall.ECONNRESET)
		}
		if cid == 0 {
			if pc.params, err = rsp.Params(); err != nil {
				return pc, fmt.Errorf("rtrs/rdmatr: cid %d: %w", cid, err)
			}
		}
	}
	return pc, p.info(pc)
}

// info runs INFO_REQ/INFO_RSP on cid 0 and posts the receives.
func (p *clientPath) info(pc *pathConns) (err error) {
	c, qd := p.c, pc.params.QueueDepth
	rspLen := rtrs.InfoRspBufSize(qd)
	if pc.info, err = mmapRegion(rtrs.InfoReqSize + rspLen); err != nil {
		return err
	}
	if pc.infoMR, err = pc.pd.RegMR(pc.info[:cap(pc.info)], rdma.AccessLocalWrite); err != nil {
		return err
	}
	rb := rdma.NewRecvBatch(1, 1)
	defer rb.Free()
	rb.Add(infoRecvID, pc.infoMR.SGE(rtrs.InfoReqSize, rspLen))
	if _, err := rb.Post(pc.svc.qp); err != nil {
		return err
	}
	var req rtrs.InfoReq
	if err := req.SetName(c.cfg.SessName); err != nil {
		return err
	}
	req.MarshalTo(pc.info)
	sb := rdma.NewSendBatch(1, 1)
	defer sb.Free()
	sb.Add(rdma.SendWR{Opcode: rdma.WRSend, Flags: rdma.SendSignaled}, pc.infoMR.SGE(0, rtrs.InfoReqSize))
	if _, err := sb.Post(pc.svc.qp); err != nil {
		return err
	}
	wcs := make([]rdma.WC, 4)
	deadline := time.Now().Add(c.cfg.Timeout)
	for got := false; !got; {
		n, err := pc.svc.cq.Poll(wcs)
		if err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rdma.WCSuccess {
				return fmt.Errorf("rtrs/rdmatr: INFO exchange: %v: %w", wc.Status, syscall.ECONNRESET)
			}
			if wc.WRID == infoRecvID {
				var rsp rtrs.InfoRsp
				if err := rsp.Unmarshal(pc.info[rtrs.InfoReqSize : rtrs.InfoReqSize+int(wc.ByteLen)]); err != nil {
					return err
				}
				if pc.chunks, err = rsp.ChunkBufs(qd, uint32(pc.params.ChunkSize), nil); err != nil {
					return err
				}
				got = true
			}
		}
		if n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("rtrs/rdmatr: no INFO_RSP: %w", syscall.ETIMEDOUT)
			}
			waitFd(pc.svc.cc.Fd(), 10*time.Millisecond)
			pc.svc.drainEvents()
		}
	}
	if err := pc.svc.postRecvs(0, pc.svc.nrecv); err != nil {
		return err
	}
	for _, cn := range pc.io {
		if err := cn.postRecvs(0, cn.nrecv); err != nil {
			return err
		}
	}
	return nil
}

// adopt fixes the session parameters from the first path that connects
// (creating the queues), checks later paths against them, and registers
// the client's memory with the path's device.
func (c *Client) adopt(pc *pathConns) (err error) {
	c.mu.Lock()
	if !c.adopted {
		c.params = pc.params
		qd := pc.params.QueueDepth
		if c.hdr, err = mmapRegion(qd * pc.params.MaxHdrSize); err != nil {
			c.mu.Unlock()
			return err
		}
		c.queueSet = rtrs.NewQueueSet(rtrs.NewPermits(qd))
		for i := 0; i < c.cfg.Queues; i++ {
			q, err := newClientQueue(c, i)
			if err != nil {
				c.mu.Unlock()
				return err
			}
			c.queues = append(c.queues, q)
		}
		c.adopted = true
		close(c.ready)
	}
	c.mu.Unlock()
	if pc.params.QueueDepth != c.params.QueueDepth || pc.params.ChunkSize != c.params.ChunkSize || pc.params.MaxHdrSize != c.params.MaxHdrSize {
		return fmt.Errorf("rtrs/rdmatr: path parameters differ from the session's: %w", syscall.EINVAL)
	}
	if err := c.registerParts(pc); err != nil {
		return err
	}
	pc.hdrMR, err = pc.pd.RegMR(c.hdr[:cap(c.hdr)], rdma.AccessLocalWrite)
	return err
}

// attach hands the IO connections to the queues; each queue claims its
// connection until it releases it.
func (p *clientPath) attach(pc *pathConns) {
	n := len(p.c.queues)
	pc.claims = make([]atomic.Bool, n)
	pc.released = make(chan struct{})
	pc.holders.Store(int32(n))
	for i, q := range p.c.queues {
		pc.claims[i].Store(true)
		q.post(qmsg{kind: msgAttach, pc: pc, cn: pc.io[i]})
	}
}

// release gives up queue qid's claim on the set, once; the last release
// lets teardown free it.
func (pc *pathConns) release(qid int) {
	if pc.claims[qid].Swap(false) && pc.holders.Add(-1) == 0 {
		close(pc.released)
	}
}

// fail is called (from any thread) when a connection of the set failed.
func (pc *pathConns) fail(why string, args ...any) {
	if !pc.failed.Swap(true) {
		if l := pc.p.c.cfg.Logf; l != nil && !pc.p.c.closed.Load() {
			l("rtrs/rdmatr client path %v: "+why, append([]any{pc.p.addr}, args...)...)
		}
		pc.p.wake()
	}
}

// serve runs the service connection (heartbeats) and watches CM events
// until the path fails or the client closes.
func (p *clientPath) serve(pc *pathConns) {
	c := p.c
	sb := rdma.NewSendBatch(4, 1)
	defer sb.Free()
	rb := rdma.NewRecvBatch(pc.svc.nrecv, 1)
	defer rb.Free()
	wcs := make([]rdma.WC, 32)
	fds := []unix.PollFd{{Fd: int32(pc.ch.Fd()), Events: unix.POLLIN}, {Fd: int32(pc.svc.cc.Fd()), Events: unix.POLLIN}, {Fd: int32(p.wakeFD), Events: unix.POLLIN}}
	next := time.Now().Add(c.cfg.HeartbeatInterval)
	var fenceOut *fenceCall // sent, not answered yet: one at a time
	defer func() {
		err := fmt.Errorf("rtrs/rdmatr client: path %v went down before the fence was answered: %w", p.addr, syscall.ENOTCONN)
		if fenceOut != nil {
			fenceOut.done <- err
		}
		p.fenceMu.Lock()
		for _, fc := range p.fenceQ {
			fc.done <- err
		}
		p.fenceQ = nil
		p.fenceMu.Unlock()
	}()
	for !c.closed.Load() && !pc.failed.Load() && p.cmd.Load() == cmdNone {
		ms := max(int(time.Until(next)/time.Millisecond), 0)
		unix.Poll(fds, ms)
		var b [8]byte
		unix.Read(p.wakeFD, b[:])
		for {
			ev, err := pc.ch.GetEvent()
			if err != nil {
				break
			}
			ev.Ack()
			switch ev.Type {
			case rdma.EventDisconnected, rdma.EventConnectError, rdma.EventUnreachable, rdma.EventRejected,
				rdma.EventAddrChange, rdma.EventTimewaitExit, rdma.EventDeviceRemoval:
				pc.fail("%v (status %d)", ev.Type, ev.Status)
			}
		}
		if err := pc.svc.drainEvents(); err != nil {
			pc.fail("service connection: %v", err)
		}
		for {
			n, err := pc.svc.cq.Poll(wcs)
			if err != nil {
				pc.fail("service connection: %v", err)
				break
			}
			for _, wc := range wcs[:n] {
				if wc.Status != rdma.WCSuccess {
					pc.fail("service connection: %v: %v", wc.Opcode, wc.Status)
					continue
				}
				if wc.Opcode&rdma.WCRecv == 0 {
					continue
				}
				p.hbMissed.Store(0)
				rb.Add(wc.WRID, pc.svc.recvSGE(int(wc.WRID)))
				if !wc.HasImm() {
					continue
				}
				switch t, _ := rtrs.SplitImm(wc.Imm); t {
				case rtrs.ImmHBMsg:
					sb.Add(rdma.SendWR{Opcode: rdma.WRWriteWithImm, Imm: rtrs.HeartbeatAckImm})
				case rtrs.ImmHBAck:
					if !pc.hbSent.IsZero() {
						p.rtt.Store(int64(time.Since(pc.hbSent)))
					}
				case rtrs.ImmFenceRsp:
					if fenceOut != nil {
						if _, v := rtrs.SplitImm(wc.Imm); v != 0 {
							fenceOut.done <- fmt.Errorf("rtrs/rdmatr client: fence refused: %w", syscall.Errno(v))
						} else {
							fenceOut.done <- nil
						}
						fenceOut = nil
					}
				}
			}
			if n < len(wcs) {
				break
			}
		}
		if time.Now().After(next) {
			next = time.Now().Add(c.cfg.HeartbeatInterval)
			switch m := p.hbMissed.Load(); {
			case int(m) > c.cfg.MissedHeartbeats:
				pc.fail("%d heartbeats missed", m)
			case m > 0:
				p.hbMissed.Add(1)
			default:
				p.hbMissed.Store(1)
				pc.hbSent = time.Now()
				sb.Add(rdma.SendWR{Opcode: rdma.WRWriteWithImm, Imm: rtrs.HeartbeatImm})
			}
		}
		if rb.Len() > 0 {
			if _, err := rb.Post(pc.svc.qp); err != nil {
				pc.fail("service connection: %v", err)
			}
		}
		if fenceOut == nil {
			p.fenceMu.Lock()
			if len(p.fenceQ) > 0 {
				fc := p.fenceQ[0]
				p.fenceQ = p.fenceQ[1:]
				fenceOut = &fc
			}
			p.fenceMu.Unlock()
			if fenceOut != nil {
				// The INFO buffer is free once INFO is done.
				(&rtrs.FenceReq{SessUUID: fenceOut.target}).MarshalTo(pc.info)
				sb.Add(rdma.SendWR{Opcode: rdma.WRSend}, pc.infoMR.SGE(0, rtrs.FenceReqSize))
			}
		}
		if sb.Len() > 0 {
			if _, err := sb.Post(pc.svc.qp); err != nil {
				pc.fail("service connection: %v", err)
			}
		}
	}
}

// fencing reports whether the server fences paths (rtrs.FlagFence).
func (c *Client) fencing() bool { return c.params.Flags&rtrs.FlagFence != 0 }

// fenceRetry is how often a path that went down tries again to have the
// server fence it through another path.
const fenceRetry = 50 * time.Millisecond

// fenceLoop has the server close connect gen of p, through another
// connected path, so that the requests p carried may go again: the server
// then starts none of the copies it may still have unread, and no RDMA
// write of them lands in its chunks any more. It ends when that is done,
// when p connected again (which fences it too) or when the client closes.
func (p *clientPath) fenceLoop(gen uint64) {
	defer p.c.wg.Done()
	for p.fencedGen.Load() < gen && !p.c.closed.Load() {
		p.c.mu.Lock()
		others := make([]*clientPath, 0, len(p.c.paths))
		for _, o := range p.c.paths {
			if o != p && o.state.Load() == PathStateConnected {
				others = append(others, o)
			}
		}
		p.c.mu.Unlock()
		for _, o := range others {
			if o.fence(p.uuid) == nil {
				p.markFenced(gen)
				return
			}
		}
		deadline := time.Now().Add(fenceRetry)
		for !p.c.closed.Load() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// fence asks the server, on p's service connection, to close the path
// target, and waits for the answer.
func (p *clientPath) fence(target rtrs.UUID) error {
	fc := fenceCall{target: target, done: make(chan error, 1)}
	p.fenceMu.Lock()
	p.fenceQ = append(p.fenceQ, fc)
	p.fenceMu.Unlock()
	p.wake()
	timeout := time.NewTimer(p.c.cfg.HeartbeatInterval * time.Duration(p.c.cfg.MissedHeartbeats+1))
	defer timeout.Stop()
	for {
		select {
		case err := <-fc.done:
			return err
		case <-timeout.C:
			return syscall.ETIMEDOUT
		case <-time.After(10 * time.Millisecond):
			if p.c.closed.Load() {
				return syscall.ENOTCONN
			}
		}
	}
}

// markFenced records that the server has closed p's connects up to gen and
// lets the queues resend their requests.
func (p *clientPath) markFenced(gen uint64) {
	if !p.fencedGen.Advance(gen) {
		return
	}
	for _, q := range p.c.queues {
		q.post(qmsg{kind: msgFenced, path: p, gen: gen})
	}
}

// teardown disconnects the set, takes it from the queues (their requests
// fail over) and frees it once no queue polls its CQs.
func (p *clientPath) teardown(pc *pathConns) {
	pc.failed.Store(true)
	pc.svc.id.Disconnect()
	for _, cn := range pc.io {
		cn.id.Disconnect()
	}
	for _, q := range p.c.queues {
		q.post(qmsg{kind: msgDetach, pc: pc})
	}
	// A queue that no event loop drives (RNBD keeps queues for devices
	// not mapped yet, and for devices unmapped: Detach) cannot release:
	// it has not even taken its connection, or no loop reads its mailbox.
	// When it is driven again it finds the set failed and leaves it
	// without touching it (attachConn and Attach check failed, set above,
	// after driven is set). So its claim is dropped here. failed is
	// stored before driven is loaded, and Attach and Detach store driven
	// before they load failed: a queue that teardown does not see
	// undriven sees the set failed.
	for _, q := range p.c.queues {
		if !q.driven.Load() {
			pc.release(q.id)
		}
	}
	select {
	case <-pc.released:
	case <-time.After(p.c.cfg.Timeout):
		// A queue whose loop stopped still holds it: leak rather than
		// free it under the queue.
		if l := p.c.cfg.Logf; l != nil {
			l("rtrs/rdmatr client path %v: %d queue(s) did not release their connections within %v; leaking them", p.addr, pc.holders.Load(), p.c.cfg.Timeout)
		}
		return
	}
	pc.destroy()
}

func (pc *pathConns) destroy() {
	pc.svc.destroy(false)
	pc.svc = nil
	for _, cn := range pc.io {
		cn.destroy(false)
	}
	pc.io = nil
	pc.p.c.forgetParts(pc)
	for _, mr := range append(pc.partMR, pc.hdrMR, pc.infoMR) {
		if mr != nil {
			mr.Dereg()
		}
	}
	pc.partMR, pc.hdrMR, pc.infoMR = nil, nil, nil
	munmap(pc.info)
	pc.info = nil
	if pc.pd != nil {
		pc.pd.Dealloc()
		pc.pd = nil
	}
	if pc.ch != nil {
		// Ids are gone; drain what is left so Close does not block.
		for {
			ev, err := pc.ch.GetEvent()
			if err != nil {
				break
			}
			ev.Ack()
		}
		pc.ch.Close()
		pc.ch = nil
	}
	// If the device went away, librdmacm closes it only now that nothing
	// of ours is on it, and only if told to look: without this the
	// kernel's removal of the device (rdma link delete) waits for us.
	_ = rdma.ForgetRemovedDevices()
}
