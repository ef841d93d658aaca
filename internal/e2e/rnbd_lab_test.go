package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/internal/rnbdtest"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/ublk"
)

// rnbdOverTCP starts an RNBD server exporting dir over RTRS/TCP on loopback
// and returns a client session to it.
func rnbdOverTCP(t *testing.T, dir string) *rnbd.Client {
	t.Helper()
	addr := rnbdtest.ServeTCP(t, rnbd.ServerConfig{DevSearchPath: dir, MaxIOSize: 126976})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rnbd.DialTCP(ctx, tcp.ClientConfig{SessName: "e2e", Paths: []tcp.PathAddr{{Dst: addr}},
		Queues: 2, Policy: rtrs.MinInflight, MaxReconnectAttempts: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A file exported by the RNBD server, mapped by the RNBD client as a ublk
// device: fio verify, discard and write zeroes, and a file system with a
// file copied and checksummed.
func TestLabRNBDOverTCP(t *testing.T) {
	labtest.NeedUblk(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 512<<20); err != nil {
		t.Fatal(err)
	}
	c := rnbdOverTCP(t, dir)
	ctrl := openControl(t)
	ctx := context.Background()
	d, err := c.Map(ctx, ctrl, "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	dev := ublk.BlockPath(d.UblkDevice().ID())
	unmapped := false
	defer func() {
		if !unmapped {
			d.Unmap(ctx)
		}
	}()

	b, _ := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/size")
	if got, _ := strconv.Atoi(string(bytes.TrimSpace(b))); got != 512<<20>>9 {
		t.Errorf("%s has %d sectors, want the server's %d", dev, got, 512<<20>>9)
	}

	res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "128M")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify over RNBD/TCP: %v, %d job errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify over RNBD/RTRS/TCP: %d I/Os, 0 errors", res.IOs())

	// Discard and write zeroes read back as zeroes, on the device and in
	// the server's file.
	labtest.Run(t, "blkdiscard", "-o", "0", "-l", strconv.Itoa(1<<20), dev)
	labtest.Run(t, "blkdiscard", "-z", "-o", strconv.Itoa(1<<20), "-l", strconv.Itoa(1<<20), dev)
	out, err := exec.Command("dd", "if="+dev, "bs=1M", "count=2", "iflag=direct", "status=none").Output()
	if err != nil || !bytes.Equal(out, make([]byte, 2<<20)) {
		t.Errorf("discarded and zeroed range does not read back as zeroes (%v)", err)
	}

	// A file system: make, mount, copy, checksum, unmount, check again.
	labtest.NeedCommand(t, "mkfs.ext4")
	labtest.Run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	labtest.Run(t, "mount", dev, mnt)
	payload := bytes.Repeat([]byte("rnbd over rtrs over tcp\n"), 200000)
	src := filepath.Join(t.TempDir(), "payload")
	os.WriteFile(src, payload, 0o600)
	labtest.Run(t, "cp", src, filepath.Join(mnt, "payload"))
	want := labtest.Run(t, "sha256sum", src)[:64]
	labtest.Run(t, "umount", mnt)
	labtest.Run(t, "sh", "-c", "echo 3 > /proc/sys/vm/drop_caches")
	labtest.Run(t, "mount", dev, mnt)
	got := labtest.Run(t, "sha256sum", filepath.Join(mnt, "payload"))[:64]
	labtest.Run(t, "umount", mnt)
	if got != want {
		t.Errorf("file copied to the RNBD file system: sha256 %s, want %s", got, want)
	}

	if err := d.Unmap(ctx); err != nil {
		t.Errorf("unmap: %v", err)
	}
	unmapped = true
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still exists after unmap", dev)
	}

	// Two devices of one session at once, then one again after the
	// other's unmap (its RTRS queues are attached to a new device's rings).
	os.WriteFile(filepath.Join(dir, "second.img"), nil, 0o600)
	os.Truncate(filepath.Join(dir, "second.img"), 128<<20)
	d1, err := c.Map(ctx, ctrl, "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	d2, err := c.Map(ctx, ctrl, "second.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	for _, dd := range []*rnbd.Device{d1, d2} {
		p := ublk.BlockPath(dd.UblkDevice().ID())
		if res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(p, "32M")...); err != nil || res.Errors() != 0 {
			t.Errorf("fio verify on %s with two devices mapped: %v\n%s", p, err, stderr)
		}
	}
	if err := d1.Unmap(ctx); err != nil {
		t.Error(err)
	}
	d3, err := c.Map(ctx, ctrl, "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	for _, dd := range []*rnbd.Device{d2, d3} {
		p := ublk.BlockPath(dd.UblkDevice().ID())
		if res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(p, "32M")...); err != nil || res.Errors() != 0 {
			t.Errorf("fio verify on %s after a remap: %v\n%s", p, err, stderr)
		}
		dd.Unmap(ctx)
	}
}
