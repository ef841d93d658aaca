package ublk_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/ublk"
)

func openControl(t *testing.T) *ublk.Control {
	t.Helper()
	labtest.NeedUblk(t)
	ctrl, err := ublk.OpenControl()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrl.Close() })
	return ctrl
}

func create(t *testing.T, ctrl *ublk.Control, opts ublk.Options, target ublk.Target) *ublk.Device {
	t.Helper()
	dev, err := ublk.Create(ctrl, opts, target)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(ublk.BlockPath(dev.ID())); err == nil {
			dev.Delete()
		}
	})
	return dev
}

func sysfsSectors(t *testing.T, id uint32) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/ublkb%d/size", id))
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestLabNullDevice(t *testing.T) {
	ctrl := openControl(t)
	dev := create(t, ctrl, ublk.Options{ID: -1, Size: 1 << 30, Queues: 2, Depth: 64}, ublk.NullTarget{})
	if got := sysfsSectors(t, dev.ID()); got != 1<<21 {
		t.Errorf("size = %d sectors, want %d", got, 1<<21)
	}
	info, err := ctrl.DevInfo(dev.ID())
	if err != nil {
		t.Fatal(err)
	}
	if info.State != ublk.StateLive || info.NrHWQueues != 2 || info.QueueDepth != 64 || info.ServerPID != int32(os.Getpid()) {
		t.Errorf("info = %+v", info)
	}
	if info.Flags&ublk.FlagUserRecovery == 0 {
		t.Errorf("flags %#x lack user recovery", info.Flags)
	}
	res, stderr, err := labtest.Fio(t, "--name=null", "--filename="+ublk.BlockPath(dev.ID()),
		"--ioengine=io_uring", "--direct=1", "--rw=randrw", "--bs=4k", "--iodepth=32",
		"--numjobs=2", "--time_based", "--runtime=2")
	if err != nil || res.Errors() != 0 {
		t.Fatalf("fio: %v, %d job errors\n%s", err, res.Errors(), stderr)
	}
	if res.IOs() == 0 {
		t.Fatal("fio did no I/O")
	}
	t.Logf("null: %.0f IOPS", res.IOPS())
	if err := dev.Delete(); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := os.Stat(ublk.BlockPath(dev.ID())); !os.IsNotExist(err) {
		t.Errorf("%s still exists after delete", ublk.BlockPath(dev.ID()))
	}
	if _, err := ctrl.DevInfo(dev.ID()); err == nil {
		t.Error("device info still available after delete")
	}
}

func loopDevice(t *testing.T, ctrl *ublk.Control, path string, queues int) (*ublk.Device, *ublk.LoopTarget) {
	t.Helper()
	target, err := ublk.OpenLoop(path, false)
	if err != nil {
		t.Fatal(err)
	}
	opts := target.Options()
	opts.Queues = queues
	dev := create(t, ctrl, opts, target)
	t.Cleanup(func() { target.Close() })
	return dev, target
}

func fioVerify(t *testing.T, dev string, perJob string) {
	t.Helper()
	res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, perJob)...)
	if err != nil || res.Errors() != 0 {
		t.Fatalf("fio verify on %s: %v, %d job errors\n%s", dev, err, res.Errors(), stderr)
	}
	if res.IOs() == 0 {
		t.Fatal("fio did no I/O")
	}
	t.Logf("verify on %s: %d I/Os, 0 errors", dev, res.IOs())
}

func TestLabLoopVerifyFile(t *testing.T) {
	ctrl := openControl(t)
	dev, target := loopDevice(t, ctrl, labtest.SparseFile(t, 256<<20), 2)
	t.Logf("backing file O_DIRECT: %v", target.Direct())
	fioVerify(t, ublk.BlockPath(dev.ID()), "96M")
}

func TestLabLoopVerifyBlockDevice(t *testing.T) {
	ctrl := openControl(t)
	if _, err := os.Stat("/dev/ram0"); err != nil {
		if out, err := exec.Command("modprobe", "brd", "rd_nr=1", "rd_size=262144").CombinedOutput(); err != nil {
			t.Skipf("no ram disk to back the device: modprobe brd: %v %s", err, out)
		}
	}
	dev, target := loopDevice(t, ctrl, "/dev/ram0", 2)
	if !target.Direct() {
		t.Error("a block device should open with O_DIRECT")
	}
	fioVerify(t, ublk.BlockPath(dev.ID()), "96M")
}

// Each queue must see its own descriptors: write distinct data from each
// CPU (so through each queue) and compare the backing file byte for byte.
func TestLabQueuesSeeTheirOwnRequests(t *testing.T) {
	ctrl := openControl(t)
	labtest.NeedCommand(t, "taskset")
	path := labtest.SparseFile(t, 16<<20)
	dev, _ := loopDevice(t, ctrl, path, 2)
	blk := ublk.BlockPath(dev.ID())
	want := make([]byte, 16<<20)
	for cpu := 0; cpu < 2; cpu++ {
		chunk := bytes.Repeat([]byte{byte('A' + cpu)}, 4<<20)
		off := cpu * (8 << 20)
		copy(want[off:], chunk)
		src := filepath.Join(t.TempDir(), "chunk")
		if err := os.WriteFile(src, chunk, 0o600); err != nil {
			t.Fatal(err)
		}
		labtest.Run(t, "taskset", "-c", strconv.Itoa(cpu), "dd", "if="+src, "of="+blk, "bs=64k",
			"seek="+strconv.Itoa(off/(64<<10)), "oflag=direct", "conv=notrunc,fsync", "status=none")
	}
	// Read back through the device from the other CPU, then from the file.
	for cpu := 0; cpu < 2; cpu++ {
		out, err := exec.Command("taskset", "-c", strconv.Itoa(1-cpu), "dd", "if="+blk, "bs=1M",
			"iflag=direct", "status=none").Output()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("device read on CPU %d differs from what was written", 1-cpu)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("backing file differs from what was written through the device")
	}
}

func TestLabLoopDiscardAndWriteZeroes(t *testing.T) {
	ctrl := openControl(t)
	labtest.NeedCommand(t, "blkdiscard")
	path := labtest.SparseFile(t, 16<<20)
	ones := bytes.Repeat([]byte{0xff}, 16<<20)
	if err := os.WriteFile(path, ones, 0o600); err != nil {
		t.Fatal(err)
	}
	dev, _ := loopDevice(t, ctrl, path, 1)
	blk := ublk.BlockPath(dev.ID())
	before, _ := exec.Command("dmesg").Output()
	// Discard the first 4 MiB, write zeroes over the next 4 MiB.
	labtest.Run(t, "blkdiscard", "-o", "0", "-l", strconv.Itoa(4<<20), blk)
	labtest.Run(t, "blkdiscard", "-z", "-o", strconv.Itoa(4<<20), "-l", strconv.Itoa(4<<20), blk)
	out, err := exec.Command("dd", "if="+blk, "bs=1M", "iflag=direct", "status=none").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[:8<<20], make([]byte, 8<<20)) {
		t.Error("discarded / zeroed range does not read back as zeroes")
	}
	if !bytes.Equal(out[8<<20:], ones[8<<20:]) {
		t.Error("data beyond the discarded range changed")
	}
	// blkdiscard -z falls back to writing zeroes itself when the device
	// fails WRITE_ZEROES; the kernel logs that, and it must not happen.
	if log, err := exec.Command("dmesg").Output(); err == nil && len(log) >= len(before) &&
		bytes.Contains(log[len(before):], []byte("error, dev ublkb"+strconv.Itoa(int(dev.ID())))) {
		t.Errorf("the kernel logged a failed request:\n%s", log[len(before):])
	}
}

// readLoop reads n 4 KiB blocks of dev with O_DIRECT from this goroutine.
func readLoop(tb testing.TB, f *os.File, buf []byte, n int) {
	for i := 0; i < n; i++ {
		if _, err := unix.Pread(int(f.Fd()), buf, int64(i%1024)*4096); err != nil {
			tb.Fatal(err)
		}
	}
}

func openDirect(tb testing.TB, path string) (*os.File, []byte) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		tb.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	return f, buf
}

// The queue loops allocate nothing per I/O: the count is process-wide, so it
// covers the queue threads serving the reads as well as the reader.
func TestLabQueueLoopAllocatesNothing(t *testing.T) {
	ctrl := openControl(t)
	for _, tc := range []struct {
		name   string
		target func() (ublk.Target, ublk.Options)
	}{
		{"null", func() (ublk.Target, ublk.Options) {
			return ublk.NullTarget{}, ublk.Options{ID: -1, Size: 64 << 20}
		}},
		{"loop", func() (ublk.Target, ublk.Options) {
			lt, err := ublk.OpenLoop(labtest.SparseFile(t, 64<<20), false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lt.Close() })
			return lt, lt.Options()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, opts := tc.target()
			opts.Queues = 2
			dev := create(t, ctrl, opts, target)
			f, buf := openDirect(t, ublk.BlockPath(dev.ID()))
			defer f.Close()
			readLoop(t, f, buf, 100) // warm up
			allocs := testing.AllocsPerRun(5, func() { readLoop(t, f, buf, 200) })
			if perIO := allocs / 200; perIO > 0.01 {
				t.Errorf("%.3f allocations per I/O, want 0", perIO)
			}
		})
	}
}

// BenchmarkLabNullRead: 4 KiB O_DIRECT reads at queue depth 1 through a
// ublk null device; -benchmem shows the allocations per I/O of the whole
// process, the queue threads included.
func BenchmarkLabNullRead(b *testing.B) {
	labtest.NeedUblk(b)
	ctrl, err := ublk.OpenControl()
	if err != nil {
		b.Fatal(err)
	}
	defer ctrl.Close()
	dev, err := ublk.Create(ctrl, ublk.Options{ID: -1, Size: 64 << 20, Queues: 1}, ublk.NullTarget{})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Delete()
	f, buf := openDirect(b, ublk.BlockPath(dev.ID()))
	defer f.Close()
	b.ReportAllocs()
	b.ResetTimer()
	readLoop(b, f, buf, b.N)
}

// The tags' buffers come from the region the caller supplies (what a
// transport registers for RDMA): a null target leaves them as they are, so
// a read returns what the caller put in the region.
func TestLabBuffersFromCallerRegion(t *testing.T) {
	ctrl := openControl(t)
	const depth, maxIO = 4, 64 << 10
	region, err := unix.Mmap(-1, 0, depth*maxIO, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(region)
	for i := range region {
		region[i] = 0xA5
	}
	dev := create(t, ctrl, ublk.Options{ID: -1, Size: 16 << 20, Queues: 1, Depth: depth, MaxIOBytes: maxIO,
		Buffers: region}, ublk.NullTarget{})
	f, buf := openDirect(t, ublk.BlockPath(dev.ID()))
	defer f.Close()
	if _, err := unix.Pread(int(f.Fd()), buf, 8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, bytes.Repeat([]byte{0xA5}, len(buf))) {
		t.Fatalf("read returned % x..., want the region's 0xa5 bytes", buf[:8])
	}
}

// Each queue's thread is pinned to the CPUs the block layer maps to that
// queue: with one queue per CPU, one CPU each, every CPU once (6.12 maps
// queue i to CPU i, 7.3 queue 0 to CPU 1). (The kernel reads the queue of
// GET_QUEUE_AFFINITY from data[0]; asking with queue_id gets queue 0's
// CPUs for every queue, and every thread on one CPU.)
func TestLabQueueThreadsPinnedToTheirCPUs(t *testing.T) {
	ctrl := openControl(t)
	ncpu := runtime.NumCPU()
	if ncpu < 2 {
		t.Skip("needs 2 CPUs")
	}
	dev, _ := loopDevice(t, ctrl, labtest.SparseFile(t, 16<<20), ncpu)
	pinned := map[string]bool{}
	mapped := map[int]int{} // CPU: queue
	for q := range ncpu {
		set, err := ctrl.QueueAffinity(dev.ID(), uint16(q))
		if err != nil {
			t.Fatal(err)
		}
		for cpu := range ncpu {
			if set.IsSet(cpu) {
				if other, ok := mapped[cpu]; ok {
					t.Errorf("CPU %d is in the affinity of queues %d and %d", cpu, other, q)
				}
				mapped[cpu] = q
			}
		}
		if set.Count() != 1 {
			t.Errorf("queue %d: affinity has %d CPUs; want one", q, set.Count())
		}
	}
	t.Logf("CPU to queue: %v", mapped)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		status, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				pinned[strings.TrimSpace(v)] = true
			}
		}
	}
	for cpu := range ncpu {
		if !pinned[strconv.Itoa(cpu)] {
			t.Errorf("no thread is pinned to CPU %d alone (threads' CPU lists: %v)", cpu, pinned)
		}
	}
}

// The optional features are asked for where the driver offers them and
// used; where it does not (6.12), they are not negotiated and TryStop and
// Resize say EOPNOTSUPP. With safe stop, TryStop refuses an open device
// and leaves it serving; with update size, Resize changes what the block
// layer sees.
func TestLabOptionalFeaturesByDetection(t *testing.T) {
	ctrl := openControl(t)
	offered, err := ctrl.Features()
	if err != nil {
		t.Fatal(err)
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	t.Logf("kernel %s offers %v", unix.ByteSliceToString(uts.Release[:]), ublk.FeatureNames(offered))
	dev := create(t, ctrl, ublk.Options{ID: -1, Size: 16 << 20, Queues: 1, Depth: 4}, ublk.NullTarget{})
	got := dev.Info().Flags
	for _, f := range []uint64{ublk.FlagSafeStopDev, ublk.FlagUpdateSize, ublk.FlagBatchIO} {
		if (got&f != 0) != (offered&f != 0) {
			t.Errorf("%v: offered %v, negotiated %v", ublk.FeatureNames(f), offered&f != 0, got&f != 0)
		}
	}

	if offered&ublk.FlagUpdateSize == 0 {
		if err := dev.Resize(32 << 20); !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("Resize without update_size: %v, want EOPNOTSUPP", err)
		}
	} else {
		if err := dev.Resize(32 << 20); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		if n := sysfsSectors(t, dev.ID()); n != 65536 {
			t.Errorf("after Resize to 32 MiB the block device has %d sectors", n)
		}
		if err := dev.Resize(1000); !errors.Is(err, unix.EINVAL) {
			t.Errorf("Resize to 1000 bytes: %v, want EINVAL", err)
		}
	}

	if offered&ublk.FlagSafeStopDev == 0 {
		if err := dev.TryStop(); !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("TryStop without safe_stop_dev: %v, want EOPNOTSUPP", err)
		}
		return
	}
	f, buf := openDirect(t, ublk.BlockPath(dev.ID()))
	if err := dev.TryStop(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("TryStop of an open device: %v, want EBUSY", err)
	}
	if _, err := unix.Pread(int(f.Fd()), buf, 0); err != nil {
		t.Errorf("read after a refused TryStop: %v", err)
	}
	f.Close()
	if err := dev.TryStop(); err != nil {
		t.Fatalf("TryStop of a closed device: %v", err)
	}
	select {
	case <-dev.Done():
	default:
		t.Error("TryStop returned with queues still running")
	}
	if err := dev.Delete(); err != nil {
		t.Errorf("Delete after TryStop: %v", err)
	}
}

// Both queue protocols, each with data copied through the tags' buffers
// and with the requests' own pages (zero copy), serve a loop device through
// fio verify without an allocation per I/O: the per-tag protocol and the
// copy everywhere (asked for with NoBatchIO and NoZeroCopy where the driver
// offers more), batch I/O and automatic buffer registration where the
// driver offers them (Linux 7.0 and 6.16 on), and Create uses those there
// by default.
func TestLabQueueProtocols(t *testing.T) {
	ctrl := openControl(t)
	offered, err := ctrl.Features()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		noBatch, noZCopy bool
	}{
		{"per-tag,copy", true, true},
		{"per-tag,zero-copy", true, false},
		{"batch,copy", false, true},
		{"batch,zero-copy", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantBatch := !tc.noBatch && offered&ublk.FlagBatchIO != 0
			wantZCopy := !tc.noZCopy && offered&ublk.FlagAutoBufReg != 0
			if !tc.noBatch && !wantBatch {
				t.Skip("this ublk driver offers no batch I/O (Linux 6.12); the 7.x lab kernel runs this")
			}
			if !tc.noZCopy && !wantZCopy {
				t.Skip("this ublk driver offers no automatic buffer registration (Linux 6.12); the 7.x lab kernel runs this")
			}
			target, err := ublk.OpenLoop(labtest.SparseFile(t, 128<<20), false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { target.Close() })
			opts := target.Options()
			opts.Queues, opts.Depth, opts.NoBatchIO, opts.NoZeroCopy = 2, 32, tc.noBatch, tc.noZCopy
			dev := create(t, ctrl, opts, target)
			flags := dev.Info().Flags
			if got := flags&ublk.FlagBatchIO != 0; got != wantBatch {
				t.Errorf("batch_io negotiated: %v, want %v", got, wantBatch)
			}
			if got := flags&ublk.FlagAutoBufReg != 0; got != wantZCopy {
				t.Errorf("auto_buf_reg negotiated: %v, want %v", got, wantZCopy)
			}
			fioVerify(t, ublk.BlockPath(dev.ID()), "48M")
			f, buf := openDirect(t, ublk.BlockPath(dev.ID()))
			readLoop(t, f, buf, 100)
			allocs := testing.AllocsPerRun(5, func() { readLoop(t, f, buf, 200) })
			if perIO := allocs / 200; perIO > 0.01 {
				t.Errorf("%.3f allocations per I/O, want 0", perIO)
			}
			f.Close() // DEL_DEV waits for the block device's last close
			if err := dev.Delete(); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if err := dev.Wait(); err != nil {
				t.Errorf("queues ended with %v", err)
			}
		})
	}
}

// A target that serves only from the tags' buffers never gets the
// requests' pages, even where the driver could hand them over.
func TestLabZeroCopyOnlyForZeroCopiers(t *testing.T) {
	ctrl := openControl(t)
	dev := create(t, ctrl, ublk.Options{ID: -1, Size: 16 << 20, Queues: 1, Depth: 4}, bufferTarget{})
	if dev.Info().Flags&ublk.FlagAutoBufReg != 0 {
		t.Errorf("auto_buf_reg negotiated for a target that is no ZeroCopier")
	}
	f, buf := openDirect(t, ublk.BlockPath(dev.ID()))
	readLoop(t, f, buf, 20)
	f.Close()
}

// bufferTarget is the null target without its ZeroCopier method.
type bufferTarget struct{}

func (bufferTarget) NewQueue(q *ublk.Queue) (ublk.QueueHandler, error) {
	return ublk.NullTarget{}.NewQueue(q)
}
