package rnbd

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// backend is an opened export: a regular file, a block device or a
// memory export (mem set, f nil).
type backend struct {
	mem      *memoryStore
	f        *os.File
	fd       int
	size     atomic.Uint64 // bytes; a session's repeated open updates it
	lbs      uint32
	blockDev bool
	readOnly bool
	direct   bool // fd is open with O_DIRECT
	// key identifies the opened object, whatever name reached it:
	// "DEV:INO" of a regular file, "blk:MAJOR:MINOR" of a block device (so
	// two device nodes of one disk are one export). Empty for memory
	// exports.
	key string
	// path is the name the export was opened by, for logs.
	path string
}

// openExport opens the export a client names, confined beneath the search
// root, in one lookup that a symlink swap cannot race (a check of one name
// followed by an open of the same name could).
//
// devName goes through ResolveDevPath first (no "..", PathMax,
// %SESSNAME%); a refusal wraps syscall.EINVAL. The root is searchPath, or
// the text before %SESSNAME% + "/" + sessName, and sessName must then be a
// single path component (not empty, ".", ".." or containing "/"), so one
// session cannot name another's root. The root is opened as a directory
// (a missing root wraps ENOENT) and the rest of the path is resolved from
// it with openat2 RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS:
//
//   - symlinks, final ones included, are followed while they stay beneath
//     the root; a relative one climbing above it, any absolute one (even
//     if it points back inside) and /proc magic links wrap EINVAL. The
//     lookup stops at the escaping component before it reaches the outside
//     target, so the answer does not reveal whether that target exists;
//   - ENOENT means the name does not exist beneath the root;
//   - without openat2 (Linux < 5.6) the error wraps EOPNOTSUPP: there is
//     no fallback to an unconfined open.
//
// The object is first opened O_PATH, which has no side effects, and
// anything but a regular file or block device wraps EINVAL, so FIFOs,
// sockets, directories and character devices are never really opened.
// The real open repeats the confined lookup with O_NONBLOCK|O_NOCTTY
// (O_DIRECT when the filesystem allows it) and must reach the same
// (dev, ino); after one retry a mismatch wraps EINVAL. A FIFO or device
// node beneath the root swapped in between the two opens is therefore
// opened, without blocking, and refused.
//
// It returns the backend (key and path set, O_NONBLOCK cleared) and the
// path it opened, for logs.
func openExport(searchPath, sessName, devName string, readOnly bool) (*backend, string, error) {
	full, err := ResolveDevPath(searchPath, sessName, devName)
	if err != nil {
		return nil, "", fmt.Errorf("device %q: %w: %w", devName, err, syscall.EINVAL)
	}
	root := searchPath
	if i := strings.Index(searchPath, SessNameToken); i >= 0 {
		if sessName == "" || sessName == "." || sessName == ".." || strings.Contains(sessName, "/") {
			return nil, "", fmt.Errorf("device %q: session name %q is not a single path component: %w",
				devName, sessName, syscall.EINVAL)
		}
		root = searchPath[:i] + "/" + sessName
	}
	root = collapseSlashes(root)
	if root == "" {
		root = "/" // ResolveDevPath made "/" + devName
	}
	prefix := strings.TrimSuffix(root, "/") + "/"
	rel, ok := strings.CutPrefix(full, prefix)
	if !ok || rel == "" || path.Clean(rel) == "." {
		return nil, "", fmt.Errorf("device %q names no file beneath dev_search_path %s: %w", devName, root, syscall.EINVAL)
	}

	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("dev_search_path %s: %w", root, err)
	}
	defer unix.Close(rootFD)

	acc := uint64(unix.O_RDWR)
	if readOnly {
		acc = unix.O_RDONLY
	}
	for attempt := 0; ; attempt++ {
		fd, st, err := openBeneath(rootFD, root, rel, devName, acc)
		if err == errChanged && attempt == 0 {
			continue
		}
		if err == errChanged {
			return nil, "", fmt.Errorf("device %q: %s changed while opening: %w", devName, full, syscall.EINVAL)
		}
		if err != nil {
			return nil, "", err
		}
		b, err := newFileBackend(fd, &st, full, readOnly)
		if err != nil {
			return nil, "", fmt.Errorf("device %q: %s: %w", devName, full, err)
		}
		return b, full, nil
	}
}

// errChanged reports that the two lookups of openBeneath reached different
// objects.
var errChanged = errors.New("export changed while opening")

// openBeneath opens rel beneath rootFD with access mode acc: an O_PATH open
// to check the type, then the real open, which must reach the same object.
// It returns the open fd (O_NONBLOCK still set) and its stat, errChanged,
// or an error with context.
func openBeneath(rootFD int, root, rel, devName string, acc uint64) (int, unix.Stat_t, error) {
	var st, st2 unix.Stat_t
	pfd, err := openat2Beneath(rootFD, rel, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return -1, st, beneathErr(devName, root, err)
	}
	err = unix.Fstat(pfd, &st)
	unix.Close(pfd)
	if err != nil {
		return -1, st, fmt.Errorf("device %q: fstat: %w", devName, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFBLK {
		return -1, st, fmt.Errorf("device %q: not a regular file or block device (mode %#o): %w",
			devName, st.Mode, syscall.EINVAL)
	}
	flags := acc | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	fd, err := openat2Beneath(rootFD, rel, flags|unix.O_DIRECT)
	if err == unix.EINVAL {
		fd, err = openat2Beneath(rootFD, rel, flags)
	}
	if err != nil {
		return -1, st, beneathErr(devName, root, err)
	}
	if err := unix.Fstat(fd, &st2); err != nil {
		unix.Close(fd)
		return -1, st, fmt.Errorf("device %q: fstat: %w", devName, err)
	}
	if st2.Dev != st.Dev || st2.Ino != st.Ino || st2.Mode&unix.S_IFMT != st.Mode&unix.S_IFMT {
		unix.Close(fd)
		return -1, st, errChanged
	}
	return fd, st2, nil
}

// openat2Beneath is openat2(rootFD, rel) confined beneath rootFD without
// magic links. It retries EINTR, and EAGAIN, which openat2 returns when a
// concurrent rename or mount keeps it from proving a ".." stayed beneath.
func openat2Beneath(rootFD int, rel string, flags uint64) (int, error) {
	how := unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(rootFD, rel, &how)
		if (err == unix.EINTR || err == unix.EAGAIN) && i < 16 {
			continue
		}
		return fd, err
	}
}

// beneathErr gives a failed openat2 of devName its meaning for the client.
func beneathErr(devName, root string, err error) error {
	switch err {
	case unix.EXDEV:
		return fmt.Errorf("device %q: path leaves dev_search_path %s: %w", devName, root, syscall.EINVAL)
	case unix.ELOOP:
		return fmt.Errorf("device %q: path leaves dev_search_path %s through a magic link, or loops: %w",
			devName, root, syscall.EINVAL)
	case unix.ENOENT:
		return fmt.Errorf("device %q: no such file beneath dev_search_path %s: %w", devName, root, syscall.ENOENT)
	case unix.ENOSYS:
		return fmt.Errorf("device %q: opening exports safely needs openat2 (Linux 5.6+): %w", devName, syscall.EOPNOTSUPP)
	}
	return fmt.Errorf("device %q: open beneath dev_search_path %s: %w", devName, root, err)
}

// newFileBackend makes the backend of fd, a regular file or block device
// whose fstat is st, named name. It clears O_NONBLOCK and takes ownership
// of fd, closing it on error.
func newFileBackend(fd int, st *unix.Stat_t, name string, readOnly bool) (*backend, error) {
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("clear O_NONBLOCK: %w", err)
	}
	b := &backend{fd: fd, lbs: 512, readOnly: readOnly, path: name}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		b.direct = fl&unix.O_DIRECT != 0
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		b.size.Store(uint64(st.Size))
		b.key = fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	case unix.S_IFBLK:
		b.blockDev = true
		b.key = fmt.Sprintf("blk:%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		var size uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
			unix.Close(fd)
			return nil, fmt.Errorf("BLKGETSIZE64: %w", e)
		}
		b.size.Store(size)
		if lbs, err := unix.IoctlGetInt(fd, unix.BLKSSZGET); err == nil && lbs > 0 {
			b.lbs = uint32(lbs)
		}
	default:
		unix.Close(fd)
		return nil, fmt.Errorf("not a regular file or block device: %w", syscall.EINVAL)
	}
	b.f = os.NewFile(uintptr(fd), name)
	return b, nil
}

// close closes the backend's file, if it has one.
func (b *backend) close() {
	if b.f != nil {
		b.f.Close()
	}
}

// geometry fills the device part of an OpenRsp.
func (b *backend) geometry(rsp *OpenRsp, maxIO int) {
	rsp.NSectors = b.size.Load() >> 9
	rsp.LogicalBlockSize = uint16(b.lbs)
	rsp.PhysicalBlockSize = 4096
	if uint32(rsp.PhysicalBlockSize) < b.lbs {
		rsp.PhysicalBlockSize = uint16(b.lbs)
	}
	rsp.MaxHWSectors = uint32(maxIO >> 9)
	rsp.MaxSegments = 128
	rsp.MaxDiscardSectors = 1 << 22
	rsp.MaxWriteZeroesSectors = 1 << 22
	rsp.DiscardGranularity = 4096
	// Completed writes may sit in the page cache or a disk cache until a
	// flush: a volatile cache, and FUA is honoured.
	rsp.CachePolicy = CacheWriteback | CacheFUA
}

// check returns 0 if op may run on the backend, else -errno: EIO out of
// range, EROFS a change to a read-only mapping.
func (b *backend) check(op IOOp, off int64, n int) int {
	if op != OpFlush && (off < 0 || uint64(off)+uint64(n) > b.size.Load()) {
		return -int(syscall.EIO)
	}
	if b.readOnly && op != OpRead && op != OpFlush {
		return -int(syscall.EROFS)
	}
	return 0
}

// async reports whether op goes through the io_uring engine: reads,
// writes and flushes of files and block devices.
func (b *backend) async(op IOOp) bool {
	return b.mem == nil && (op == OpRead || op == OpWrite || op == OpFlush)
}

// serve performs one request on the backend synchronously and returns 0
// or -errno. Of rw's flags it honours FUA (a data sync after a write),
// PREFLUSH (one before the request) and NOUNMAP (write zeroes that keep
// the range allocated).
func (b *backend) serve(rw RW, off int64, n int, data []byte) int {
	op, fua := rw.Op(), rw.FUA()
	if e := b.check(op, off, n); e != 0 {
		return e
	}
	if b.mem != nil {
		return b.mem.serve(op, off, n, data)
	}
	var err error
	if rw.Preflush() && op != OpFlush {
		if err := datasync(b.fd); err != nil {
			return errnoOf(err)
		}
	}
	switch op {
	case OpRead:
		err = fullIO(unix.Pread, b.fd, data, off)
	case OpWrite:
		err = fullIO(unix.Pwrite, b.fd, data, off)
		if err == nil && fua {
			err = datasync(b.fd)
		}
	case OpFlush:
		err = datasync(b.fd)
	case OpDiscard:
		err = unix.Fallocate(b.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
		if errors.Is(err, syscall.EOPNOTSUPP) {
			err = nil // discard is advisory
		}
	case OpWriteZeroes:
		// ZERO_RANGE keeps the range allocated (on a block device it is
		// BLKDEV_ZERO_NOUNMAP); where it is missing, a hole may do, unless
		// the client asked that nothing be unmapped.
		err = unix.Fallocate(b.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
		if errors.Is(err, syscall.EOPNOTSUPP) {
			if rw.NoUnmap() {
				err = writeZeroes(b.fd, off, n)
			} else {
				err = unix.Fallocate(b.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
			}
		}
	default:
		return -int(syscall.EOPNOTSUPP)
	}
	if err != nil {
		return errnoOf(err)
	}
	return 0
}

// datasync is fdatasync(2); a test sees through it in what order the
// backend syncs and writes.
var datasync = unix.Fdatasync

// zeroes is what writeZeroes writes: 64 KiB of anonymous pages, zero and
// page-aligned for O_DIRECT; mapped at the first use.
var zeroes = sync.OnceValues(func() ([]byte, error) {
	return unix.Mmap(-1, 0, 64<<10, unix.PROT_READ, unix.MAP_ANON|unix.MAP_PRIVATE)
})

// writeZeroes writes n zero bytes at off, for a write zeroes that must not
// unmap where the backend cannot zero a range in place.
func writeZeroes(fd int, off int64, n int) error {
	z, err := zeroes()
	if err != nil {
		return err
	}
	for n > 0 {
		k := min(n, len(z))
		if err := fullIO(unix.Pwrite, fd, z[:k], off); err != nil {
			return err
		}
		off, n = off+int64(k), n-k
	}
	return nil
}

// fullIO repeats pread/pwrite until all of p is done.
func fullIO(op func(int, []byte, int64) (int, error), fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := op(fd, p, off)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			return err
		}
		if n == 0 {
			return syscall.EIO
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}
