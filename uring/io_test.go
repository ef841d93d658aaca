package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "data"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func expectRes(t *testing.T, what string, c CQE, want int32) {
	t.Helper()
	if c.Res != want {
		t.Fatalf("%s: res %d (%s), want %d", what, c.Res, errnoName(c.Res), want)
	}
}

func TestReadWrite(t *testing.T) {
	r := newRing(t, 8, 0)
	f := tempFile(t)
	fd := int32(f.Fd())
	const size = 3 * 4096
	buf := mmapBuf(t, size)
	fill(buf, 1)

	// Three writes at scattered offsets in one submission.
	for i := range 3 {
		blk := buf[i*4096 : (i+1)*4096]
		r.GetSQE().PrepWrite(fd, unsafe.Pointer(&blk[0]), 4096, uint64(i)*8192, uint64(i))
	}
	submitAll(t, r)
	for _, c := range reap(t, r, 3) {
		expectRes(t, "write", c, 4096)
	}
	for i := range 3 {
		got := make([]byte, 4096)
		if _, err := f.ReadAt(got, int64(i)*8192); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, buf[i*4096:(i+1)*4096]) {
			t.Errorf("block %d written through the ring differs", i)
		}
	}

	// Read them back through the ring.
	in := mmapBuf(t, size)
	for i := range 3 {
		blk := in[i*4096 : (i+1)*4096]
		r.GetSQE().PrepRead(fd, unsafe.Pointer(&blk[0]), 4096, uint64(i)*8192, uint64(10+i))
	}
	submitAll(t, r)
	for _, c := range reap(t, r, 3) {
		expectRes(t, "read", c, 4096)
	}
	if !bytes.Equal(in, buf) {
		t.Errorf("data read through the ring differs")
	}

	// A short read at the end of the file.
	c := run(t, r, func(s *SQE) { s.PrepRead(fd, unsafe.Pointer(&in[0]), 4096, 2*8192+4000, 20) })
	expectRes(t, "short read", c, 96)

	// Vectored I/O.
	out := mmapBuf(t, 2*4096)
	fill(out, 99)
	iovs := []unix.Iovec{{Base: &out[0]}, {Base: &out[4096]}}
	iovs[0].SetLen(100)
	iovs[1].SetLen(4096)
	c = run(t, r, func(s *SQE) { s.PrepWritev(fd, iovs, 50000, 30) })
	expectRes(t, "writev", c, 4196)
	back := mmapBuf(t, 4196)
	riov := []unix.Iovec{{Base: &back[0]}}
	riov[0].SetLen(4196)
	c = run(t, r, func(s *SQE) { s.PrepReadv(fd, riov, 50000, 31) })
	expectRes(t, "readv", c, 4196)
	if !bytes.Equal(back[:100], out[:100]) || !bytes.Equal(back[100:], out[4096:]) {
		t.Errorf("readv data differs from writev data")
	}

	// Errors come back as -errno.
	c = run(t, r, func(s *SQE) { s.PrepRead(-1, unsafe.Pointer(&in[0]), 1, 0, 40) })
	if c.Err() != unix.EBADF {
		t.Errorf("read from fd -1: res %d, want -EBADF", c.Res)
	}
}

func TestFixedFilesAndBuffers(t *testing.T) {
	r := newRing(t, 8, 0)
	f := tempFile(t)
	buf := mmapBuf(t, 8192)
	fill(buf[:4096], 5)

	if err := r.RegisterFiles([]int32{-1, int32(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	iov := []unix.Iovec{{Base: &buf[0]}}
	iov[0].SetLen(len(buf))
	if err := r.RegisterBuffers(iov); err != nil {
		t.Fatal(err)
	}

	c := run(t, r, func(s *SQE) {
		s.PrepWriteFixed(1, unsafe.Pointer(&buf[0]), 4096, 0, 0, 1)
		s.Flags |= SQEFixedFile
	})
	expectRes(t, "write_fixed", c, 4096)
	c = run(t, r, func(s *SQE) {
		s.PrepReadFixed(1, unsafe.Pointer(&buf[4096]), 4096, 0, 0, 2)
		s.Flags |= SQEFixedFile
	})
	expectRes(t, "read_fixed", c, 4096)
	if !bytes.Equal(buf[:4096], buf[4096:]) {
		t.Errorf("fixed buffer read back differs")
	}

	// Slot 0 is empty until updated.
	c = run(t, r, func(s *SQE) {
		s.PrepRead(0, unsafe.Pointer(&buf[4096]), 1, 0, 3)
		s.Flags |= SQEFixedFile
	})
	if c.Err() != unix.EBADF {
		t.Errorf("read from empty fixed slot: res %d, want -EBADF", c.Res)
	}
	if n, err := r.UpdateFiles(0, []int32{int32(f.Fd())}); err != nil || n != 1 {
		t.Fatalf("UpdateFiles = %d, %v", n, err)
	}
	c = run(t, r, func(s *SQE) {
		s.PrepRead(0, unsafe.Pointer(&buf[4096]), 10, 0, 4)
		s.Flags |= SQEFixedFile
	})
	expectRes(t, "read from updated slot", c, 10)

	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterFiles(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterFiles(); !errors.Is(err, unix.ENXIO) {
		t.Errorf("second UnregisterFiles = %v, want ENXIO", err)
	}
}

func TestFsyncFallocate(t *testing.T) {
	r := newRing(t, 8, 0)
	f := tempFile(t)
	fd := int32(f.Fd())
	const size = 64 << 10
	data := bytes.Repeat([]byte{0xaa}, size)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}

	expectRes(t, "fsync", run(t, r, func(s *SQE) { s.PrepFsync(fd, 0, 1) }), 0)
	expectRes(t, "fdatasync", run(t, r, func(s *SQE) { s.PrepFsync(fd, FsyncDatasync, 2) }), 0)

	// Grow the file with mode 0.
	expectRes(t, "fallocate", run(t, r, func(s *SQE) { s.PrepFallocate(fd, 0, size, size, 3) }), 0)
	if st, err := f.Stat(); err != nil || st.Size() != 2*size {
		t.Fatalf("size after fallocate: %v, %v; want %d", st.Size(), err, 2*size)
	}

	want := append([]byte(nil), data...)
	want = append(want, make([]byte, size)...)

	c := run(t, r, func(s *SQE) {
		s.PrepFallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 8192, 4)
	})
	expectRes(t, "punch hole", c, 0)
	clear(want[4096 : 4096+8192])

	c = run(t, r, func(s *SQE) { s.PrepFallocate(fd, unix.FALLOC_FL_ZERO_RANGE, 32768, 1000, 5) })
	if c.Err() == unix.EOPNOTSUPP {
		t.Log("file system has no FALLOC_FL_ZERO_RANGE")
	} else {
		expectRes(t, "zero range", c, 0)
		clear(want[32768 : 32768+1000])
	}

	got := mmapBuf(t, 2*size)
	c = run(t, r, func(s *SQE) { s.PrepRead(fd, unsafe.Pointer(&got[0]), 2*size, 0, 6) })
	expectRes(t, "read back", c, 2*size)
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Errorf("file content differs first at offset %d: %#x, want %#x", i, got[i], want[i])
	}
}

// A sparse table has slots but no buffers: a fixed read from a slot fails
// until a driver installs one (ublk does, in the lab tests), and a second
// table cannot be registered over the first.
func TestRegisterBuffersSparse(t *testing.T) {
	r := newRing(t, 8, 0)
	f := tempFile(t)
	if err := r.RegisterBuffersSparse(4); err != nil {
		t.Fatal(err)
	}
	c := run(t, r, func(s *SQE) { s.PrepReadFixedAt(int32(f.Fd()), 0, 512, 0, 2, 1) })
	if c.Res >= 0 {
		t.Errorf("read into an empty sparse slot: res %d, want an error", c.Res)
	}
	if err := r.RegisterBuffersSparse(4); !errors.Is(err, unix.EBUSY) {
		t.Errorf("second table: %v, want EBUSY", err)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Errorf("unregister: %v", err)
	}
}
