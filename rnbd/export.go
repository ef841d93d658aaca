package rnbd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resolveExport turns a client's dev_name into the path of the file or
// block device to open. It applies the kernel server's rule
// (ResolveDevPath: no "..", dev_search_path with %SESSNAME%) and, stricter
// than the kernel, refuses a path whose symbolic links lead outside the
// search root: an export cannot be used to reach the rest of the server.
func resolveExport(searchPath, sessName, devName string) (string, error) {
	p, err := ResolveDevPath(searchPath, sessName, devName)
	if err != nil {
		return "", fmt.Errorf("device %q: %w", devName, syscall.EINVAL)
	}
	root := searchPath
	if i := strings.Index(searchPath, "%SESSNAME%"); i >= 0 {
		root = filepath.Join(searchPath[:i], sessName)
	}
	realRoot, err := filepath.EvalSymlinks(filepath.Clean(root))
	if err != nil {
		return "", fmt.Errorf("dev_search_path %s: %w", root, err)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("device %q: %w", devName, err)
	}
	if real != realRoot && !strings.HasPrefix(real, realRoot+string(filepath.Separator)) && realRoot != "/" {
		return "", fmt.Errorf("device %q resolves to %s, outside %s: %w", devName, real, realRoot, syscall.EINVAL)
	}
	return real, nil
}

// backend is an opened export: a regular file, a block device or a
// memory export (mem set, f nil).
type backend struct {
	mem      *memoryStore
	f        *os.File
	fd       int
	size     uint64
	lbs      uint32
	blockDev bool
	readOnly bool
}

func openBackend(path string, readOnly bool) (*backend, error) {
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flags|unix.O_DIRECT, 0)
	if errors.Is(err, syscall.EINVAL) {
		f, err = os.OpenFile(path, flags, 0)
	}
	if err != nil {
		return nil, err
	}
	b := &backend{f: f, fd: int(f.Fd()), lbs: 512, readOnly: readOnly}
	var st unix.Stat_t
	if err := unix.Fstat(b.fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		b.size = uint64(st.Size)
	case unix.S_IFBLK:
		b.blockDev = true
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&b.size))); e != 0 {
			f.Close()
			return nil, e
		}
		if lbs, err := unix.IoctlGetInt(b.fd, unix.BLKSSZGET); err == nil && lbs > 0 {
			b.lbs = uint32(lbs)
		}
	default:
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file or block device: %w", path, syscall.EINVAL)
	}
	return b, nil
}

// geometry fills the device part of an OpenRsp.
func (b *backend) geometry(rsp *OpenRsp, maxIO int) {
	rsp.NSectors = b.size >> 9
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
	if op != OpFlush && (off < 0 || uint64(off)+uint64(n) > b.size) {
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
// or -errno.
func (b *backend) serve(op IOOp, fua bool, off int64, n int, data []byte) int {
	if e := b.check(op, off, n); e != 0 {
		return e
	}
	if b.mem != nil {
		return b.mem.serve(op, off, n, data)
	}
	var err error
	switch op {
	case OpRead:
		err = fullIO(unix.Pread, b.fd, data, off)
	case OpWrite:
		err = fullIO(unix.Pwrite, b.fd, data, off)
		if err == nil && fua {
			err = unix.Fdatasync(b.fd)
		}
	case OpFlush:
		err = unix.Fdatasync(b.fd)
	case OpDiscard:
		err = unix.Fallocate(b.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
		if errors.Is(err, syscall.EOPNOTSUPP) {
			err = nil // discard is advisory
		}
	case OpWriteZeroes:
		err = unix.Fallocate(b.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
		if errors.Is(err, syscall.EOPNOTSUPP) {
			err = unix.Fallocate(b.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, int64(n))
		}
	default:
		return -int(syscall.EOPNOTSUPP)
	}
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return -int(errno)
		}
		return -int(syscall.EIO)
	}
	return 0
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
