package rnbd

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/uring"
)

// transport is what the RNBD client needs of an RTRS client session; one
// implementation per RTRS transport (TCP, RDMA).
type transport interface {
	// queues is the number of per-CPU queues for block requests.
	queues() int
	// maxIOSize is the session's max_io_size.
	maxIOSize() int
	// call sends an admin message and waits; a read (respLen > 0) returns
	// the answer's bytes. errno is the server's answer (0 or negative).
	call(ctx context.Context, write bool, usr []byte, respLen int) (errno int, resp []byte, err error)
	// acquire reserves a block of per-CPU queues for one mapped device
	// (each RTRS queue serves one ublk queue, on its thread), and the
	// memory its tag buffers must come from (registered, for RDMA; nil
	// means any memory).
	acquire(bufBytes int) (block int, bufs []byte, err error)
	// release returns what acquire reserved.
	release(block int)
	// maxDevices is how many blocks there are.
	maxDevices() int
	// resume lets IO go after reconnect gen, once the devices are
	// reopened (rtrs.Link).
	resume(gen uint64)
	// queue binds queue i of a block to a ublk queue's ring: block
	// requests go out on it and their completions come back through it.
	// It is called on the ublk queue's thread, whose id is tid.
	queue(block, i, tid int, ring *uring.Ring, base uint64, depth int, done func(tag uint16, errno int)) transportQueue
	// completionQueues lists the RDMA completion queues of attached
	// block queues (none over TCP).
	completionQueues() []CompletionQueue
	// paths describes the session's paths.
	paths() []PathStatus
	// pathManager manages the session's paths at run time.
	pathManager() pathManager
	close() error
}

// pathManager is what both RTRS clients (tcp, rdmatr) offer to manage
// their paths at run time.
type pathManager interface {
	AddPath(a rtrs.PathAddr) (int, error)
	RemovePath(idx int) error
	DisconnectPath(idx int) error
	ReconnectPath(idx int) error
	SetPolicy(p rtrs.MPPolicy)
	SetMaxReconnectAttempts(n int) error
}

// transportQueue is one per-CPU queue of a transport, attached to a ublk
// queue's io_uring.
type transportQueue interface {
	submit(tag uint16, write bool, usr, data []byte) error
	handleCQE(cqe *uring.CQE)
	flush()
	// detach is called when the ublk queue stops driving the queue; its
	// ring is closed next.
	detach()
	// do runs fn on the queue's thread, soon (unless the queue stopped).
	do(fn func())
}

// PathStatus describes one RTRS path of a session.
type PathStatus struct {
	Index int    // the path's index in its session, for path commands
	Addr  string // "[src@]dst"
	State string
	// RTT is the last heartbeat round trip (the kernel's cur_latency);
	// zero before the first heartbeat is answered.
	RTT time.Duration
	// LastError is why the last connect attempt failed ("" after one
	// succeeded).
	LastError string
	Stats     *rtrs.ClientPathStats
}

func numCPU() int { return runtime.NumCPU() }

// blocks hands out queue blocks: each mapped device has a block of
// per-CPU RTRS queues of its own.
type blocks struct {
	mu   sync.Mutex
	used []bool
}

func newBlocks(n int) blocks { return blocks{used: make([]bool, n)} }

func (b *blocks) maxDevices() int { return len(b.used) }

func (b *blocks) get() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.used {
		if !b.used[i] {
			b.used[i] = true
			return i, nil
		}
	}
	return 0, fmt.Errorf("rnbd: the session maps at most %d devices at a time; map more under another session name: %w", len(b.used), syscall.ENOSPC)
}

func (b *blocks) put(i int) {
	b.mu.Lock()
	b.used[i] = false
	b.mu.Unlock()
}
