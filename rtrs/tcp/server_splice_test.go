package tcp

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rtrs"
)

// fileBackend serves requests from a file, as memBackend does from
// memory: reads through SpliceRead where it takes them.
type fileBackend struct {
	fd              int
	spliced, copied atomic.Int64
}

func (b *fileBackend) HandleIO(io *ServerIO) {
	off := int64(binary.LittleEndian.Uint64(io.Usr))
	if io.Write {
		if _, err := unix.Pwrite(b.fd, io.Data, off); err != nil {
			io.Complete(-int(syscall.EIO))
			return
		}
		io.Complete(0)
		return
	}
	if io.SpliceRead(b.fd, off) {
		b.spliced.Add(1)
		return
	}
	b.copied.Add(1)
	if n, err := unix.Pread(b.fd, io.Data, off); err != nil || n != len(io.Data) {
		io.Complete(-int(syscall.EIO))
		return
	}
	io.Complete(0)
}

func newFileBackend(t *testing.T, size int64) *fileBackend {
	f, err := os.Create(filepath.Join(t.TempDir(), "backend"))
	mustNoErr(t, err)
	mustNoErr(t, f.Truncate(size))
	t.Cleanup(func() { f.Close() })
	return &fileBackend{fd: int(f.Fd())}
}

// TestSpliceReadVerified writes patterns and reads them back through a
// server whose large reads go from the file to the socket by splice.
func TestSpliceReadVerified(t *testing.T) {
	b := newFileBackend(t, 16<<20)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 2, addr)
	for _, size := range []int{4096, 32 << 10, 60 << 10} {
		for _, v := range runVerifiers(c, 8, size, 10) {
			v.Wait(t, 20*time.Second)
		}
	}
	if b.spliced.Load() == 0 {
		t.Errorf("no read was spliced (%d copied)", b.copied.Load())
	}
	if b.copied.Load() == 0 {
		t.Errorf("every read was spliced: 4 KiB reads should have been copied")
	}
}

// TestSpliceReadError reads past the end of the file: the answer is an
// errno with no data, and the connection serves the next read.
func TestSpliceReadError(t *testing.T) {
	b := newFileBackend(t, 1<<20)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	c := dialTest(t, rtrs.MinInflight, 1, addr)
	read := func(off int) int {
		done := make(chan int, 1)
		usr := make([]byte, 8)
		binary.LittleEndian.PutUint64(usr, uint64(off))
		r := &Request{Data: make([]byte, 32<<10), Usr: usr, Done: func(_ *Request, errno int) { done <- errno }}
		onQueue(c.Queue(0), func(q *ClientQueue) { mustNoErr(t, q.Submit(r)) })
		select {
		case e := <-done:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("read not answered")
			return 0
		}
	}
	// 16 KiB past the end: the splice ends short.
	if e := read(1<<20 - 16<<10); e != -int(syscall.EIO) {
		t.Errorf("read across the end of the file: errno %d, want %d", e, -int(syscall.EIO))
	}
	if e := read(0); e != 0 {
		t.Errorf("read after the failed one: errno %d", e)
	}
	if b.spliced.Load() != 2 {
		t.Errorf("%d reads spliced, want 2", b.spliced.Load())
	}
	if paths := c.Paths(); len(paths) != 1 || paths[0].State != "connected" {
		t.Errorf("paths after the failed read: %+v", paths)
	}
}

// TestSpliceReadAllocatesNothing: the spliced answer allocates nothing
// per request, on either side.
func TestSpliceReadAllocatesNothing(t *testing.T) {
	b := newFileBackend(t, 1<<20)
	_, addr := startIOServer(t, b, "127.0.0.1:0")
	checkNoAllocsPerRequest(t, dialTest(t, rtrs.MinInflight, 1, addr))
	if b.spliced.Load() == 0 {
		t.Error("no read was spliced")
	}
}
