//go:build linux

package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// needBPF skips t unless the host can load tracing programs: root and
// kernel BTF.
func needBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skip("the kernel has no BTF (/sys/kernel/btf/vmlinux), which tp_btf and CO-RE need")
	}
}

// loadBlock loads the block latency programs or skips t if this kernel
// cannot run them.
func loadBlock(t *testing.T, opts BlockLatencyOptions) *BlockLatency {
	t.Helper()
	b, err := LoadBlockLatency(opts)
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel lacks a BPF feature: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testDisk returns a directory on a disk and that disk: the test's temp
// directory if it is on one, else a directory on the disk mounted on /.
func testDisk(t *testing.T) (string, uint64) {
	t.Helper()
	dir := t.TempDir()
	if dev, err := DiskOf(dir); err == nil {
		return dir, dev
	}
	root, err := rootDisk()
	if err != nil {
		t.Skipf("no disk for the test I/O: %v", err)
	}
	dir, err = os.MkdirTemp("/var/tmp", "urnbd-bpf-test-")
	if err != nil {
		t.Skipf("no disk for the test I/O: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if dev, err := DiskOf(dir); err != nil || dev != root {
		t.Skipf("no directory on the root disk %s for the test I/O", DevName(root))
	}
	return dir, root
}

// rootDisk returns the disk mounted on / (from /proc/self/mountinfo).
func rootDisk() (uint64, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[4] == "/" {
			dev, err := parseDev(fields[2])
			if err != nil {
				return 0, err
			}
			return WholeDisk(dev)
		}
	}
	return 0, errors.New("/ not in /proc/self/mountinfo")
}

// directIO writes n blocks of 4 KiB with O_DIRECT to path (a file, created
// if missing, or a block device), fsyncs it, and reads them back with
// O_DIRECT, checking the data if verify is set (a device that stores it).
func directIO(t *testing.T, path string, n int, verify bool) {
	t.Helper()
	const bs = 4096
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(bs)
	for i := range n {
		for j := range buf {
			buf[j] = byte(i + j)
		}
		if _, err := f.WriteAt(buf, int64(i)*bs); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := f.ReadAt(buf, int64(i)*bs); err != nil {
			t.Fatal(err)
		}
		if !verify {
			continue
		}
		for j := range buf {
			if buf[j] != byte(i+j) {
				t.Fatalf("%s: block %d byte %d reads %#x, wrote %#x", path, i, j, buf[j], byte(i+j))
			}
		}
	}
}

// diskStat returns the completed reads and writes of dev from the kernel's
// own accounting (/sys/dev/block/M:m/stat, Documentation/block/stat.rst).
func diskStat(t *testing.T, dev uint64) (reads, writes uint64) {
	t.Helper()
	path := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(dev), unix.Minor(dev))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(string(b), &reads, new(uint64), new(uint64), new(uint64), &writes); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return reads, writes
}

// diskFacts describes the file system of dir and the queue of dev, for a
// failure message: what decides whether O_DIRECT I/O reaches the disk.
func diskFacts(dir string, dev uint64) string {
	var fs unix.Statfs_t
	_ = unix.Statfs(dir, &fs)
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	sched, _ := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/queue/scheduler", unix.Major(dev), unix.Minor(dev)))
	return fmt.Sprintf("kernel %s, file system magic %#x under %s, scheduler %s",
		unix.ByteSliceToString(uts.Release[:]), fs.Type, dir, strings.TrimSpace(string(sched)))
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+n]
}

func TestBlockLatencyCounts(t *testing.T) {
	needBPF(t)
	dir, dev := testDisk(t)
	pinDir := filepath.Join(bpfFSRoot, "urnbd-test-"+filepath.Base(dir))
	b := loadBlock(t, BlockLatencyOptions{Options: Options{PinDir: pinDir}, Devices: []uint64{dev}})
	defer b.Close()

	// The kernel's own counters are read around the histograms, so the
	// requests that the programs count are a subset of theirs.
	kr0, kw0 := diskStat(t, dev)
	h0, err := b.Histogram(dev)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	directIO(t, filepath.Join(dir, "direct.img"), n, true)
	h1, err := b.Histogram(dev)
	if err != nil {
		t.Fatal(err)
	}
	kr1, kw1 := diskStat(t, dev)
	reads, writes := h1.Count[Read]-h0.Count[Read], h1.Count[Write]-h0.Count[Write]
	kreads, kwrites := kr1-kr0, kw1-kw0
	t.Logf("device %s: reads %d, writes %d, other %d; the kernel's accounting: reads %d, writes %d",
		DevName(dev), reads, writes, h1.Count[Other]-h0.Count[Other], kreads, kwrites)
	checkCounted(t, b, dir, dev, n, [2]uint64{reads, writes}, [2]uint64{kreads, kwrites})
	for d := range Dir(NumDirs) {
		// The maps are read one after the other while other processes
		// keep doing I/O on the disk: the bucket sums and the count agree
		// up to the requests that completed in between.
		us, ms, cnt := h1.Total(d), sum(h1.Ms[d][:]), h1.Count[d]
		if slack := cnt/10 + 10; absDiff(us, cnt) > slack || absDiff(ms, cnt) > slack {
			t.Errorf("dir %d: µs buckets hold %d, ms buckets %d, count %d", d, us, ms, cnt)
		}
		if h1.Count[d] > 0 && (h1.MaxNs[d] == 0 || h1.MaxNs[d] > 60e9 || h1.SumNs[d] < h1.MaxNs[d]) {
			t.Errorf("dir %d: implausible max %d ns, sum %d ns", d, h1.MaxNs[d], h1.SumNs[d])
		}
	}
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0] != dev {
		t.Errorf("devices in the histograms: %v, want only %s", devNames(devs), DevName(dev))
	}
	var sb strings.Builder
	if err := h1.FormatRdmaLat(&sb); err != nil {
		t.Fatal(err)
	}
	t.Logf("rdma_lat of %s:\n%s", DevName(dev), sb.String())
	sb.Reset()
	h1.FormatLatUs(&sb)
	t.Logf("µs:\n%s", sb.String())

	for _, name := range []string{"urnbd_blk_us", "urnbd_blk_ms", "urnbd_blk_sum", "urnbd_blk_infl", "urnbd_blk_devs", "urnbd_blk_cfg"} {
		if _, err := os.Stat(filepath.Join(pinDir, name)); err != nil {
			t.Errorf("pin: %v", err)
		}
	}
	if bpftool, err := exec.LookPath("bpftool"); err == nil {
		out, err := exec.Command(bpftool, "map", "dump", "pinned", filepath.Join(pinDir, "urnbd_blk_sum")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "max_ns") {
			t.Errorf("bpftool map dump: %v\n%s", err, out)
		}
		out, err = exec.Command(bpftool, "prog", "show").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "urnbd_rq_issue") {
			t.Errorf("bpftool prog show lacks urnbd_rq_issue: %v\n%s", err, out)
		}
	}

	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if devs, _ := b.Devices(); len(devs) != 0 {
		t.Errorf("after Reset, devices %v", devNames(devs))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory left after Close: %v", err)
	}
}

// TestBlockLatencyFilter traces only a device that has no I/O and checks
// that I/O on another disk does not show up.
func TestBlockLatencyFilter(t *testing.T) {
	needBPF(t)
	dir, dev := testDisk(t)
	idle := unix.Mkdev(unix.Major(dev), unix.Minor(dev)+1000) // no such disk: never has I/O
	b := loadBlock(t, BlockLatencyOptions{Devices: []uint64{idle}})
	defer b.Close()

	directIO(t, filepath.Join(dir, "direct.img"), 16, true)
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 0 {
		t.Errorf("traced only %s, but the histograms have %v", DevName(idle), devNames(devs))
	}

	// Now add the disk: its I/O appears, as much of it as the kernel's
	// accounting saw.
	if err := b.AddDevice(dev); err != nil {
		t.Fatal(err)
	}
	kr0, kw0 := diskStat(t, dev)
	h0, err := b.Histogram(dev)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	directIO(t, filepath.Join(dir, "direct.img"), n, true)
	h1, err := b.Histogram(dev)
	if err != nil {
		t.Fatal(err)
	}
	kr1, kw1 := diskStat(t, dev)
	t.Logf("after AddDevice(%s): reads %d, writes %d; the kernel's accounting: reads %d, writes %d",
		DevName(dev), h1.Count[Read]-h0.Count[Read], h1.Count[Write]-h0.Count[Write], kr1-kr0, kw1-kw0)
	checkCounted(t, b, dir, dev, n,
		[2]uint64{h1.Count[Read] - h0.Count[Read], h1.Count[Write] - h0.Count[Write]},
		[2]uint64{kr1 - kr0, kw1 - kw0})
}

// checkCounted checks the reads and writes that the programs counted
// (counted) for the n synchronous reads of directIO against what the
// kernel's own accounting counted over the same time (kern).
func checkCounted(t *testing.T, b *BlockLatency, dir string, dev uint64, n uint64, counted, kern [2]uint64) {
	t.Helper()
	missed, err := b.Missed()
	if err != nil {
		t.Fatal(err)
	}
	if missed > 0 {
		t.Logf("the kernel skipped %d program runs (recursion)", missed)
	}
	// Each synchronous O_DIRECT read is one request unless the file system
	// serves it otherwise; whether it did is the kernel's accounting's to
	// say, and the programs must count what it counts. Its counter moves
	// just after the request's data is delivered, so it may lag by the last
	// read; other processes' requests in the moments between the two
	// readings make up the rest of the slack.
	if kern[0] < n {
		t.Logf("only %d of the %d reads reached the disk (%s)", kern[0], n, diskFacts(dir, dev))
	}
	for _, c := range []struct {
		dir           string
		counted, kern uint64
	}{{"reads", counted[0], kern[0]}, {"writes", counted[1], kern[1]}} {
		if c.counted < 1 || c.counted+missed+c.kern/10+4 < c.kern || c.counted > c.kern+2 {
			t.Errorf("%s counted: %d (%d runs skipped by the kernel), the kernel's accounting: %d (%s)",
				c.dir, c.counted, missed, c.kern, diskFacts(dir, dev))
		}
	}
}

func devNames(devs []uint64) []string {
	var s []string
	for _, d := range devs {
		s = append(s, DevName(d))
	}
	return s
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}
