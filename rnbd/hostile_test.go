package rnbd

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The adversarial tests of the RNBD server: a client that sends what a
// well-behaved one never would, over RTRS/TCP on loopback.

// A sector whose byte offset does not fit 64 bits is out of range; it must
// not wrap around to the start of the device.
func TestHostileSectorOverflow(t *testing.T) {
	dir := t.TempDir()
	path := mkFile(t, dir, "disk.img", 1<<20, 0)
	c := dialRNBD(t, testServer(t, dir), "s")
	if _, e := c.open("disk.img", AccessRW); e != 0 {
		t.Fatal(e)
	}
	data := bytes.Repeat([]byte{0xEE}, 4096)
	for _, sector := range []uint64{1<<55 + 1, 1 << 54, 1<<63 - 1, 1<<64 - 1} {
		m := IO{DeviceID: 0, Sector: sector, RW: MakeRW(OpWrite, 0), BiSize: 4096}
		if e := c.call(&m, true, data); e != -int(syscall.EIO) {
			t.Errorf("write at sector %#x: errno %d, want -EIO", sector, e)
		}
	}
	onDisk, _ := os.ReadFile(path)
	if !bytes.Equal(onDisk, make([]byte, 1<<20)) {
		t.Fatal("a write beyond the device changed it")
	}
}

// An OPEN that cannot carry its answer (sent as an RTRS write, or with a
// reply buffer too short) is refused before anything is opened: the
// export is not held afterwards.
func TestHostileOpenWithoutReplyBuffer(t *testing.T) {
	dir := t.TempDir()
	mkFile(t, dir, "disk.img", 1<<20, 0)
	addr := testServer(t, dir)
	a, b := dialRNBD(t, addr, "a"), dialRNBD(t, addr, "b")
	m := Open{AccessMode: AccessRW}
	if err := m.SetDevName("disk.img"); err != nil {
		t.Fatal(err)
	}
	if e := a.call(&m, true, make([]byte, OpenRspSize)); e != -int(syscall.EINVAL) {
		t.Errorf("OPEN as a write: errno %d, want -EINVAL", e)
	}
	if e := a.call(&m, false, make([]byte, 8)); e != -int(syscall.EINVAL) {
		t.Errorf("OPEN with an 8-byte reply buffer: errno %d, want -EINVAL", e)
	}
	if e := a.io(0, OpRead, 0, 0, make([]byte, 4096), 4096); e != -int(syscall.ENOTCONN) {
		t.Errorf("IO on the refused open's device: errno %d, want -ENOTCONN", e)
	}
	if _, e := b.open("disk.img", AccessRW); e != 0 {
		t.Errorf("rw open by another session: errno %d; the refused opens held the export", e)
	}
}

// Opening a FIFO, a character device or a directory is refused at once,
// with no side effect, and other sessions' control path goes on meanwhile.
func TestHostileOpenSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	mkFile(t, dir, "disk.img", 1<<20, 0)
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := dialRNBD(t, testServer(t, dir), "s")
	for _, name := range []string{"fifo", "null", "sub"} {
		start := time.Now()
		if _, e := c.open(name, AccessRW); e != -int(syscall.EINVAL) {
			t.Errorf("open %s: errno %d, want -EINVAL", name, e)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("open %s took %v", name, d)
		}
	}
	if _, e := c.open("disk.img", AccessRW); e != 0 {
		t.Fatalf("open after the refusals: errno %d", e)
	}
}

// When a session's last path goes, the server closes its devices (after
// the linger time): an rw mapping does not lock the export forever, and a
// session that claims the name afterwards gets no device it did not open.
func TestHostileSessionReleaseClosesDevices(t *testing.T) {
	dir := t.TempDir()
	mkFile(t, dir, "disk.img", 1<<20, 0)
	addr := testServer(t, dir)
	fds := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	before := fds()
	a := dialRNBD(t, addr, "tenant")
	if _, e := a.open("disk.img", AccessRW); e != 0 {
		t.Fatal(e)
	}
	other := dialRNBD(t, addr, "other")
	if _, e := other.open("disk.img", AccessRW); e != -int(syscall.EPERM) {
		t.Fatalf("second rw while the first is open: errno %d, want -EPERM", e)
	}
	a.close()
	// The same name again: a new session, with no device 0 of its own.
	deadline := time.Now().Add(5 * time.Second)
	var again *testClient
	for again == nil {
		again = tryDialRNBD(t, addr, "tenant")
		if again == nil && time.Now().After(deadline) {
			t.Fatal("the name stayed taken after its session left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e := again.io(0, OpRead, 0, 0, make([]byte, 4096), 4096); e != -int(syscall.ENOTCONN) {
		t.Errorf("IO without OPEN on a reclaimed name: errno %d, want -ENOTCONN", e)
	}
	third := dialRNBD(t, addr, "third")
	if _, e := third.open("disk.img", AccessRW); e != 0 {
		t.Errorf("rw open after the rw session left: errno %d", e)
	}
	// Every session gone: the server holds no export descriptor, no
	// connection.
	again.close()
	other.close()
	third.close()
	waitUntil(t, "descriptors back", func() bool { return fds() <= before })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
