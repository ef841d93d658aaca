package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// blockBytes returns the size of block device dev (/dev/NAME) from sysfs.
func blockBytes(t *testing.T, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/size")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n << 9
}

// TestLabResizeToServerSize: `urnbd resize DEV` follows the export on the
// server as it grows and shrinks, `resize DEV SIZE` sets a size up to the
// server's and refuses one beyond it, and I/O reaches the part the device
// grew by (the server's range check follows too). Without the driver's
// update_size (6.12) resize fails with EOPNOTSUPP and changes nothing.
func TestLabResizeToServerSize(t *testing.T) {
	c := newLabCLI(t)
	const mib = 1 << 20
	dir := imageDir(t, 64*mib)
	img := filepath.Join(dir, "a.img")
	dev := c.serveAndMapTCP(t, dir, "resize", "a.img")
	if got := blockBytes(t, dev); got != 64*mib {
		t.Fatalf("%s: %d bytes mapped, want %d", dev, got, 64*mib)
	}
	var entries []struct {
		Device   string   `json:"devname"`
		Features []string `json:"ublk_features"`
	}
	if err := json.Unmarshal([]byte(c.must("list", "--format", "json")), &entries); err != nil || len(entries) != 1 {
		t.Fatalf("list: %v %+v", err, entries)
	}

	if err := os.Truncate(img, 128*mib); err != nil {
		t.Fatal(err)
	}
	out, err := c.run("resize", dev)
	if !slices.Contains(entries[0].Features, "update_size") {
		// 6.12: the feature is absent, and nothing changes.
		if exitCodeOf(err) != int(syscall.EOPNOTSUPP) || !strings.Contains(out, "update_size") {
			t.Fatalf("resize without update_size: exit %d, %s; want EOPNOTSUPP naming update_size", exitCodeOf(err), out)
		}
		if got := blockBytes(t, dev); got != 64*mib {
			t.Errorf("%s: %d bytes after a refused resize, want %d", dev, got, 64*mib)
		}
		return
	}
	if err != nil || out != fmt.Sprintf("%s: %d bytes", dev, 128*mib) {
		t.Fatalf("resize %s after the export grew to 128 MiB: %v: %s", dev, err, out)
	}
	if got := blockBytes(t, dev); got != 128*mib {
		t.Fatalf("%s: %d bytes after resize, want %d", dev, got, 128*mib)
	}
	// The part it grew by is there, on the device and in the file.
	marker := bytes.Repeat([]byte("grown by resize!"), 256)
	writeAt(t, dev, marker, 127*mib)
	if got := readAt(t, dev, len(marker), 127*mib); !bytes.Equal(got, marker) {
		t.Errorf("read back at 127 MiB differs")
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	inFile := make([]byte, len(marker))
	_, err = f.ReadAt(inFile, 127*mib)
	f.Close()
	if err != nil || !bytes.Equal(inFile, marker) {
		t.Errorf("the export at 127 MiB does not hold what was written through %s (%v)", dev, err)
	}

	// An explicit size: up to the server's, not beyond.
	out, err = c.run("resize", dev, "256M")
	if exitCodeOf(err) != int(syscall.EINVAL) || !strings.Contains(out, "beyond") {
		t.Errorf("resize to 256M of a 128 MiB export: exit %d, %s; want EINVAL, beyond", exitCodeOf(err), out)
	}
	if got := blockBytes(t, dev); got != 128*mib {
		t.Errorf("%s: %d bytes after a refused resize, want %d", dev, got, 128*mib)
	}
	if out, err := c.run("resize", dev, "96M"); err != nil || blockBytes(t, dev) != 96*mib {
		t.Errorf("resize to 96M: %v: %s; %d bytes", err, out, blockBytes(t, dev))
	}
	if out, err := c.run("resize", dev, "0"); exitCodeOf(err) != int(syscall.EINVAL) {
		t.Errorf("resize to 0: exit %d, %s; want EINVAL", exitCodeOf(err), out)
	}

	// The export shrinks: resize follows it down.
	if err := os.Truncate(img, 32*mib); err != nil {
		t.Fatal(err)
	}
	if out, err := c.run("resize", dev); err != nil || blockBytes(t, dev) != 32*mib {
		t.Errorf("resize after the export shrank to 32 MiB: %v: %s; %d bytes", err, out, blockBytes(t, dev))
	}
	if got := readAt(t, dev, 4096, 0); len(got) != 4096 {
		t.Errorf("read at 0 after shrinking: %d bytes", len(got))
	}
	if out, err := c.run("resize", "/dev/ublkb999"); exitCodeOf(err) != int(syscall.ENOENT) {
		t.Errorf("resize of an unmapped device: exit %d, %s; want ENOENT", exitCodeOf(err), out)
	}
}
