package ublk

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LoopTarget serves a device from a file or block device, through the
// queues' own io_uring: the backend I/O completes into the same ring as the
// ublk commands, so a queue never blocks on it.
type LoopTarget struct {
	f        *os.File
	path     string
	size     uint64
	blockDev bool
	direct   bool
	readOnly bool
	lbs      uint32
	// noZeroRange is set once the file system refuses FALLOC_FL_ZERO_RANGE
	// (tmpfs does); write zeroes then punch holes, which read back as zeros.
	noZeroRange atomic.Bool
}

// OpenLoop opens path for a loop target, with O_DIRECT where the file system
// or device allows it.
func OpenLoop(path string, readOnly bool) (*LoopTarget, error) {
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	t := &LoopTarget{path: path, readOnly: readOnly, direct: true, lbs: 512}
	f, err := os.OpenFile(path, flags|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		t.direct = false
		f, err = os.OpenFile(path, flags, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open backing file: %w", err)
	}
	t.f = f
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		t.size = uint64(st.Size)
	case unix.S_IFBLK:
		t.blockDev = true
		var size uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
			f.Close()
			return nil, fmt.Errorf("%s: BLKGETSIZE64: %w", path, e)
		}
		t.size = size
		if lbs, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && lbs > 0 {
			t.lbs = uint32(lbs)
		}
	default:
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file or block device: %w", path, unix.EINVAL)
	}
	if t.size < uint64(t.lbs) {
		f.Close()
		return nil, fmt.Errorf("%s: size %d is smaller than one block: %w", path, t.size, unix.EINVAL)
	}
	return t, nil
}

// Path returns the backing file's path.
func (t *LoopTarget) Path() string { return t.path }

// Size returns the usable size in bytes: the backing size rounded down to
// the logical block size.
func (t *LoopTarget) Size() uint64 { return t.size / uint64(t.lbs) * uint64(t.lbs) }

// Direct reports whether the backing file is open with O_DIRECT.
func (t *LoopTarget) Direct() bool { return t.direct }

// Options returns device options that fit the backing file: its size and
// block size, a volatile cache (flushes become fdatasync), FUA, and discard
// and write zeroes.
func (t *LoopTarget) Options() Options {
	return Options{
		ID:                    -1,
		Size:                  t.Size(),
		LogicalBlockSize:      t.lbs,
		ReadOnly:              t.readOnly,
		VolatileCache:         true,
		FUA:                   true,
		MaxDiscardSectors:     1 << 22,
		MaxWriteZeroesSectors: 1 << 22,
		DiscardGranularity:    4096,
	}
}

// Close closes the backing file; call it after the device has ended.
func (t *LoopTarget) Close() error { return t.f.Close() }

// ZeroCopy implements ZeroCopier: the backing file is read and written
// straight from the requests' pages.
func (t *LoopTarget) ZeroCopy() bool { return true }

// NewQueue implements Target.
func (t *LoopTarget) NewQueue(q *Queue) (QueueHandler, error) {
	return &loopQueue{t: t, q: q, fd: int32(t.f.Fd()), reqs: make([]*Request, q.Depth()), done: make([]uint32, q.Depth())}, nil
}

type loopQueue struct {
	t    *LoopTarget
	q    *Queue
	fd   int32
	reqs []*Request // by tag, while in flight
	done []uint32   // bytes done so far, by tag, for short reads and writes
}

func (h *loopQueue) Handle(tag uint16, req *Request) {
	h.reqs[tag] = req
	h.done[tag] = 0
	switch req.Op {
	case OpRead, OpWrite:
		if req.Op == OpWrite && h.t.readOnly {
			h.q.Complete(tag, -int32(unix.EROFS))
			return
		}
		h.submitRW(tag, req)
	case OpFlush:
		h.q.GetSQE().PrepFsync(h.fd, fsyncDatasync, TargetUserData(uint64(tag)))
	case OpDiscard, OpWriteZeroes:
		if h.t.readOnly {
			h.q.Complete(tag, -int32(unix.EROFS))
			return
		}
		mode := uint32(modePunchHole)
		if req.Op == OpWriteZeroes && req.Flags&IOFlagNoUnmap != 0 && !h.t.noZeroRange.Load() {
			mode = modeZeroRange
		}
		h.submitFallocate(tag, req, mode)
	default:
		h.q.Complete(tag, -int32(unix.EOPNOTSUPP))
	}
}

const (
	modePunchHole = unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE
	modeZeroRange = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
)

// submitFallocate queues a fallocate for tag; the mode is kept in the user
// data so that a refused ZERO_RANGE can be retried as a hole punch.
func (h *loopQueue) submitFallocate(tag uint16, req *Request, mode uint32) {
	ud := TargetUserData(uint64(mode)<<16 | uint64(tag))
	h.q.GetSQE().PrepFallocate(h.fd, mode, uint64(req.Offset()), uint64(req.Len()), ud)
}

// fsyncDatasync is IORING_FSYNC_DATASYNC.
const fsyncDatasync = 1

// rwfDSync is RWF_DSYNC: a write with FUA is durable when it completes.
const rwfDSync = 0x2

func (h *loopQueue) submitRW(tag uint16, req *Request) {
	done := h.done[tag]
	n := uint32(req.Len()) - done
	off := uint64(req.Offset()) + uint64(done)
	ud := TargetUserData(uint64(tag))
	sqe := h.q.GetSQE()
	switch {
	case req.Fixed && req.Op == OpRead:
		sqe.PrepReadFixedAt(h.fd, uint64(done), n, off, req.BufIndex, ud)
	case req.Fixed:
		sqe.PrepWriteFixedAt(h.fd, uint64(done), n, off, req.BufIndex, ud)
	case req.Op == OpRead:
		sqe.PrepRead(h.fd, unsafe.Pointer(&req.Buf[done]), n, off, ud)
	default:
		sqe.PrepWrite(h.fd, unsafe.Pointer(&req.Buf[done]), n, off, ud)
	}
	if req.Op == OpWrite && req.Flags&IOFlagFUA != 0 {
		sqe.OpFlags = rwfDSync
	}
}

func (h *loopQueue) OnCompletion(userData uint64, res int32, _ uint32) {
	tag := uint16(TargetValue(userData))
	req := h.reqs[tag]
	if res == -int32(unix.EOPNOTSUPP) && req.Op == OpWriteZeroes && TargetValue(userData)>>16 == modeZeroRange {
		h.t.noZeroRange.Store(true)
		h.submitFallocate(tag, req, modePunchHole)
		return
	}
	if res == -int32(unix.EOPNOTSUPP) && req.Op == OpDiscard {
		// Discard is advisory: a device that cannot punch holes has
		// still done what was asked.
		res = 0
	}
	if res < 0 {
		h.q.Complete(tag, res)
		return
	}
	if req.Op != OpRead && req.Op != OpWrite {
		h.q.Complete(tag, 0)
		return
	}
	h.done[tag] += uint32(res)
	done := h.done[tag]
	switch {
	case int(done) == req.Len():
		h.q.Complete(tag, int32(done))
	case res == 0 && req.Op == OpRead && !req.Fixed:
		// End of a file whose size is not a multiple of the block
		// size: the rest reads as zeros.
		clear(req.Buf[done:])
		h.q.Complete(tag, int32(req.Len()))
	case res == 0:
		h.q.Complete(tag, -int32(unix.EIO))
	default:
		h.submitRW(tag, req)
	}
}

func (h *loopQueue) Close() error { return nil }
