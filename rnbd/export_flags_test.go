package rnbd

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// tmpfsDir is a folder on tmpfs, whose files cannot zero a range in place
// (fallocate ZERO_RANGE is EOPNOTSUPP there, PUNCH_HOLE works).
func tmpfsDir(t *testing.T) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Skip("no tmpfs at /dev/shm: write zeroes without ZERO_RANGE is not tested here")
	}
	dir, err := os.MkdirTemp("/dev/shm", "rnbd-flags-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func blocksOf(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// A write zeroes with NOUNMAP (RNBD 2.2) zeroes the range and keeps it
// allocated, also where the backend can only punch holes; without it the
// range may become a hole.
func TestWriteZeroesNoUnmap(t *testing.T) {
	root := tmpfsDir(t)
	name := filepath.Join(root, "disk")
	data := bytes.Repeat([]byte{0xA5}, 1<<20)
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b := mustOpenExport(t, root, "s", "disk", false)
	full := blocksOf(t, name)

	if ret := b.serve(MakeRW(OpWriteZeroes, FlagNoUnmap), 0, 256<<10, nil); ret != 0 {
		t.Fatalf("write zeroes NOUNMAP: %d", ret)
	}
	if got := blocksOf(t, name); got != full {
		t.Errorf("NOUNMAP: %d blocks after, %d before: the range was unmapped", got, full)
	}
	if ret := b.serve(MakeRW(OpWriteZeroes, 0), 256<<10, 256<<10, nil); ret != 0 {
		t.Fatalf("write zeroes: %d", ret)
	}
	if got := blocksOf(t, name); got >= full {
		t.Errorf("without NOUNMAP: %d blocks after, %d before: want the range punched out", got, full)
	}
	got, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:512<<10], make([]byte, 512<<10)) || !bytes.Equal(got[512<<10:], data[512<<10:]) {
		t.Error("the zeroed range or the rest of the file is not as written")
	}
}

// A write with PREFLUSH (RNBD 2.1) makes what was written before durable
// before it is written itself: the sync comes first, then the write, then
// FUA's sync.
func TestPreflushSyncsBeforeTheWrite(t *testing.T) {
	root := t.TempDir()
	name := filepath.Join(root, "disk")
	if err := os.WriteFile(name, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	b := mustOpenExport(t, root, "s", "disk", false)
	var seen [][]byte // the first sector as each sync saw it
	datasync = func(fd int) error {
		p := make([]byte, 512)
		if _, err := unix.Pread(fd, p, 0); err != nil {
			t.Error(err)
		}
		seen = append(seen, p)
		return unix.Fdatasync(fd)
	}
	t.Cleanup(func() { datasync = unix.Fdatasync })
	buf := alignedBuf(4096)
	copy(buf, bytes.Repeat([]byte{0x5A}, 4096))
	if ret := b.serve(MakeRW(OpWrite, FlagSync|FlagFUA|FlagPreflush), 0, 4096, buf); ret != 0 {
		t.Fatalf("write PREFLUSH|FUA: %d", ret)
	}
	if len(seen) != 2 || seen[0][0] != 0 || seen[1][0] != 0x5A {
		t.Fatalf("syncs saw %d states %v, want two: before the write, then after", len(seen), firstBytes(seen))
	}
	seen = nil
	if ret := b.serve(MakeRW(OpWrite, FlagSync), 0, 4096, buf); ret != 0 || len(seen) != 0 {
		t.Errorf("a plain write: %d, %d syncs; want none", ret, len(seen))
	}
	if ret := b.serve(MakeRW(OpFlush, FlagSync|FlagFUA|FlagPreflush), -1, 0, nil); ret != 0 || len(seen) != 1 {
		t.Errorf("a flush as a 2.1 client sends it: %d, %d syncs; want one", ret, len(seen))
	}
}

func firstBytes(pages [][]byte) []byte {
	out := make([]byte, len(pages))
	for i, p := range pages {
		out[i] = p[0]
	}
	return out
}
