package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/bpf"
	"github.com/urnbd/urnbd/internal/labtest"
	"golang.org/x/sys/unix"
)

// imageDir returns a new folder holding a.img, a sparse file of size
// bytes.
func imageDir(t *testing.T, size int64) string {
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	return dir
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// statsJSON runs `urnbd stats --json` (with --reset if asked).
func (c *labCLI) statsJSON(reset bool) *statsReport {
	c.t.Helper()
	args := []string{"stats", "--json"}
	if reset {
		args = append(args, "--reset")
	}
	var r statsReport
	if out := c.must(args...); json.Unmarshal([]byte(out), &r) != nil {
		c.t.Fatalf("stats --json printed:\n%s", out)
	}
	return &r
}

// fixedIO runs fio with exactly size/bs requests of rw on dev.
func fixedIO(t *testing.T, dev, rw, size string) *labtest.FioResult {
	t.Helper()
	res, stderr, err := labtest.Fio(t, "--name=io", "--filename="+dev, "--rw="+rw, "--bs=4k", "--size="+size,
		"--direct=1", "--ioengine=libaio", "--iodepth=8")
	if err != nil || res.Errors() != 0 {
		t.Fatalf("fio %s on %s: %v\n%s", rw, dev, err, stderr)
	}
	return res
}

// The statistics a user reads, checked against what fio did: urnbd's own
// per-path counters, the eBPF block latency histogram, the text formats,
// the Prometheus endpoint, `urnbd trace`, bpftool on the pinned maps and
// --reset. Over TCP, cpu_migration must say why it is not measured.
func TestLabStatsOverTCP(t *testing.T) {
	c := newLabCLI(t)
	dir := imageDir(t, 64<<20)
	port := strconv.Itoa(startServerCLI(t, c, dir))
	metrics := "127.0.0.1:" + strconv.Itoa(freePort(t))
	dev := c.must("map", "--metrics-listen", metrics, "sessname=stats", "dest_port="+port, "path=ip:127.0.0.1", "path=ip:127.0.0.2@ip:127.0.0.1", "device_path=a.img")
	t.Cleanup(func() { c.run("unmap", "--force", dev) })

	c.statsJSON(true) // from zero, without the reads of udev's probing
	reads := fixedIO(t, dev, "randread", "8M").Jobs[0].Read.IOs
	writes := fixedIO(t, dev, "randwrite", "4M").Jobs[0].Write.IOs
	if reads != 2048 || writes != 1024 {
		t.Fatalf("fio did %d reads and %d writes, want 2048 and 1024", reads, writes)
	}

	r := c.statsJSON(false)
	if r.EBPF.BlockLatency != "on" {
		t.Fatalf("block latency eBPF is off in the lab: %s", r.EBPF.BlockLatency)
	}
	if len(r.Sessions) != 1 || len(r.Sessions[0].Paths) != 2 || len(r.Devices) != 1 {
		t.Fatalf("stats: %d sessions, %d devices; want 1 with 2 paths, 1", len(r.Sessions), len(r.Devices))
	}
	var rtrsReads, rtrsWrites, sgTotal, sgSum uint64
	for _, p := range r.Sessions[0].Paths {
		for _, n := range p.Stats.SGTotal {
			sgTotal += n
		}
		sgSum += p.Stats.SGSum
		if p.State != "connected" {
			t.Errorf("path %d %s is %s", p.Index, p.Addr, p.State)
		}
		rtrsReads += p.Stats.Read.Count
		rtrsWrites += p.Stats.Write.Count
		if !strings.Contains(p.CPUMigration, "TCP") {
			t.Errorf("path %d: cpu_migration source %q over TCP", p.Index, p.CPUMigration)
		}
	}
	if rtrsReads != uint64(reads) || rtrsWrites != uint64(writes) {
		t.Errorf("RTRS counted %d reads and %d writes over both paths, fio did %d and %d", rtrsReads, rtrsWrites, reads, writes)
	}
	if sgTotal != uint64(reads+writes) || sgSum != sgTotal {
		t.Errorf("sg_entries: %d requests with %d entries, want %d with one each", sgTotal, sgSum, reads+writes)
	}
	h := r.Devices[0].Latency
	if h == nil || h.Count[bpf.Read] != uint64(reads) || h.Count[bpf.Write] != uint64(writes) ||
		h.Total(bpf.Read) != uint64(reads) || h.Total(bpf.Write) != uint64(writes) {
		t.Fatalf("eBPF histogram of %s: %+v; want %d reads and %d writes", dev, h, reads, writes)
	}
	if avg := h.SumNs[bpf.Read] / h.Count[bpf.Read]; avg < 1000 || h.MaxNs[bpf.Read] < avg || h.Us[bpf.Read][0] != 0 {
		t.Errorf("implausible read latency: average %d ns, max %d ns, %d below 1 µs", avg, h.MaxNs[bpf.Read], h.Us[bpf.Read][0])
	}

	text := c.must("stats")
	for _, want := range []string{
		"session stats (tcp) path 0", "session stats (tcp) path 1", "cur_latency:", "cpu_migration_from:",
		"cpu_migration_to:", "reconnects:", "rdma:", "reset_all:", "sg_entries:", "cpu_migration:", "rdma_lat:",
		"rdma_lat_us:", "wc_completion:", "device " + dev, "block rdma_lat:", "block rdma_lat_us:", "maximum ms:",
		">= 65536 ms:", "ebpf: block latency on",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("stats lacks %q:\n%s", want, text)
		}
	}
	// rdma: the 6.12 file, "reads read_bytes writes write_bytes inflight failovers".
	var rdmaReads uint64
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "rdma:" {
			if len(f) != 7 {
				t.Errorf("rdma line %q: want 6 numbers", l)
				continue
			}
			n, _ := strconv.ParseUint(f[1], 10, 64)
			rdmaReads += n
		}
	}
	if rdmaReads != uint64(reads) {
		t.Errorf("the rdma lines count %d reads, fio did %d", rdmaReads, reads)
	}

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf(`urnbd_block_latency_seconds_count{device=%q,sess="stats",dir="read"} %d`, dev, reads),
		fmt.Sprintf(`urnbd_block_latency_seconds_bucket{device=%q,sess="stats",dir="write",le="+Inf"} %d`, dev, writes),
		"# TYPE urnbd_rtrs_client_read_requests_total counter",
		`urnbd_ebpf_up{program="block_latency"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}

	out := c.must("trace", "--interval", "200ms", "--count", "2")
	if strings.Count(out, "urnbd trace") != 2 || !strings.Contains(out, dev) || !strings.Contains(out, "IOPS read") {
		t.Errorf("trace printed:\n%s", out)
	}

	if bpftool, err := exec.LookPath("bpftool"); err == nil {
		out, err := exec.Command(bpftool, "map", "dump", "pinned", bpf.DefaultPinDir+"/urnbd_blk_sum").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "sum_ns") {
			t.Errorf("bpftool map dump pinned urnbd_blk_sum: %v\n%s", err, out)
		}
	} else if labtest.InLab() {
		t.Error("bpftool is missing in the lab")
	}

	c.statsJSON(true)
	r = c.statsJSON(false)
	if r.Sessions[0].Paths[0].Stats.Read.Count != 0 || r.Devices[0].Latency.Count[bpf.Read] != 0 {
		t.Errorf("after stats --reset: %d RTRS reads, %d eBPF reads", r.Sessions[0].Paths[0].Stats.Read.Count, r.Devices[0].Latency.Count[bpf.Read])
	}
}

// Path and session management from the CLI while fio verifies the data:
// add a path, disconnect, reconnect and remove it, change the policy.
func TestLabPathCommandsOverTCP(t *testing.T) {
	c := newLabCLI(t)
	dir := imageDir(t, 128<<20)
	port := strconv.Itoa(startServerCLI(t, c, dir))
	dev := c.must("map", "--sessname", "paths", "--dest-port", port, "--path", "ip:127.0.0.1", "--device-path", "a.img")
	t.Cleanup(func() { c.run("unmap", "--force", dev) })

	fio := make(chan error, 1)
	go func() {
		res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "48M")...)
		if err == nil && res.Errors() != 0 {
			err = fmt.Errorf("%d errors: %s", res.Errors(), stderr)
		}
		fio <- err
	}()
	if idx := c.must("path", "add", "--dest-port", port, "paths", "ip:127.0.0.2@ip:127.0.0.1"); idx != "1" {
		t.Errorf("path add printed %q, want the new index 1", idx)
	}
	waitPaths := func(want string) {
		t.Helper()
		if !labtest.WaitFor(10e9, func() bool { return strings.Count(c.must("list"), "(connected)") == strings.Count(want, "c") }) {
			t.Errorf("paths did not become %s:\n%s", want, c.must("list"))
		}
	}
	waitPaths("cc")
	c.must("session", "set", "mp-policy", "paths", "round-robin")
	c.must("path", "disconnect", "paths", "0")
	waitPaths("c")
	c.must("path", "reconnect", "paths", "0")
	waitPaths("cc")
	if out := c.must("path", "list"); !strings.Contains(out, "127.0.0.2@127.0.0.1:"+port) || !strings.Contains(out, "CUR_LATENCY") {
		t.Errorf("path list:\n%s", out)
	}
	c.must("path", "remove", "paths", "ip:127.0.0.2@ip:127.0.0.1:"+port)
	waitPaths("c")
	if err := <-fio; err != nil {
		t.Fatalf("fio verify across path changes: %v", err)
	}

	for _, bad := range []struct {
		args  []string
		errno syscall.Errno
	}{
		{[]string{"session", "set", "mp-policy", "paths", "fastest"}, syscall.EINVAL},
		{[]string{"session", "set", "mp-policy", "nosuch", "min-inflight"}, syscall.ENOENT},
		{[]string{"path", "remove", "paths", "7"}, syscall.ENOENT},
		{[]string{"path", "add", "paths", "not-an-address"}, syscall.EINVAL},
	} {
		if out, err := c.run(bad.args...); exitCodeOf(err) != int(bad.errno) {
			t.Errorf("urnbd %s: %v %s; want %v", strings.Join(bad.args, " "), err, out, bad.errno)
		}
	}
}

// provisionRDMA sets up the lab's two soft-RoCE paths (idempotent).
func provisionRDMA(t *testing.T) {
	t.Helper()
	for _, mode := range []string{"modules", "rdma"} {
		if out, err := exec.Command("../../tools/lab/provision.sh", mode).CombinedOutput(); err != nil {
			t.Fatalf("provision.sh %s: %v\n%s", mode, err, out)
		}
	}
	labtest.Need(t, "/dev/infiniband/rdma_cm", "rdma_ucm")
}

// pinnedFio runs fio on CPU cpu with exactly size/bs requests of rw.
func pinnedFio(t *testing.T, dev, rw, size string, cpu int) int64 {
	t.Helper()
	res, stderr, err := labtest.Fio(t, "--name=io", "--filename="+dev, "--rw="+rw, "--bs=4k", "--size="+size,
		"--direct=1", "--ioengine=libaio", "--iodepth=8", "--cpus_allowed="+strconv.Itoa(cpu))
	if err != nil || res.Errors() != 0 {
		t.Fatalf("fio %s on %s: %v\n%s", rw, dev, err, stderr)
	}
	return res.Jobs[0].Read.IOs + res.Jobs[0].Write.IOs
}

// migrations sums the cpu_migration from and to counts of every path.
func migrations(r *statsReport) (from, to []uint64) {
	for _, s := range r.Sessions {
		for _, p := range s.Paths {
			for i, v := range p.Stats.MigrationFrom {
				for len(from) <= i {
					from, to = append(from, 0), append(to, 0)
				}
				from[i] += v
				to[i] += p.Stats.MigrationTo[i]
			}
		}
	}
	for len(from) < 2 {
		from, to = append(from, 0), append(to, 0)
	}
	return from, to
}

// checkMigrations checks, path by path, that the cpu_migration table is
// the completion events of each queue's CQ that were raised on another
// CPU than the one its thread is pinned to, and returns the events per
// queue (summed over the paths) and the from/to sums.
func checkMigrations(t *testing.T, r *statsReport) (events map[int][]uint64, from, to []uint64) {
	t.Helper()
	events = map[int][]uint64{}
	for _, p := range r.Sessions[0].Paths {
		if p.CPUMigration != "ebpf" || len(p.Queues) == 0 {
			t.Fatalf("path %d: cpu_migration %q, %d queues", p.Index, p.CPUMigration, len(p.Queues))
		}
		n := len(p.Stats.MigrationFrom)
		wantFrom, wantTo := make([]uint64, n), make([]uint64, n)
		for _, q := range p.Queues {
			if events[q.Queue] == nil {
				events[q.Queue] = make([]uint64, n)
			}
			for c, v := range q.PerCPU {
				events[q.Queue][c] += v
				if c != q.CPU {
					wantFrom[q.CPU] += v
					wantTo[c] += v
				}
			}
		}
		if !slices.Equal(p.Stats.MigrationFrom, wantFrom) || !slices.Equal(p.Stats.MigrationTo, wantTo) {
			t.Errorf("path %d: cpu_migration from %v to %v, but its queues' events %+v make from %v to %v",
				p.Index, p.Stats.MigrationFrom, p.Stats.MigrationTo, p.Queues, wantFrom, wantTo)
		}
	}
	from, to = migrations(r)
	return events, from, to
}

// The RDMA statistics against what fio did, and cpu_migration made to
// count by moving a queue thread. Over soft-RoCE the completion events of
// a CQ are raised wherever rxe processed the answer (its work items run
// on any CPU), so some land on the other CPU in any case; the test checks
// that the table counts exactly the events raised away from the polling
// thread's CPU, and that moving the thread of CPU 0's queue to CPU 1
// (taskset, as an operator would) turns that queue's events on CPU 0 into
// migrations from CPU 1. Then the path and session commands over RDMA.
func TestLabStatsRDMA(t *testing.T) {
	c := newLabCLI(t)
	provisionRDMA(t)
	if runtime.NumCPU() != 2 {
		t.Skip("written for the lab's 2 CPUs")
	}
	dev := c.mapOverTwoRDMAPaths(t, "cpus", 1250)

	c.statsJSON(true)
	ios := pinnedFio(t, dev, "randread", "8M", 0) + pinnedFio(t, dev, "randwrite", "4M", 0)
	r := c.statsJSON(true)
	if r.EBPF.CompletionCPU != "on" {
		t.Fatalf("completion CPU eBPF is off in the lab: %s", r.EBPF.CompletionCPU)
	}
	var rtrsIOs uint64
	for _, p := range r.Sessions[0].Paths {
		rtrsIOs += p.Stats.Read.Count + p.Stats.Write.Count
	}
	if h := r.Devices[0].Latency; rtrsIOs != uint64(ios) || h == nil || h.Count[bpf.Read]+h.Count[bpf.Write] != uint64(ios) {
		t.Errorf("fio did %d I/Os; RTRS counted %d, eBPF %+v", ios, rtrsIOs, h)
	}
	// The block layer maps a queue to each CPU; which one is the
	// kernel's choice (6.12: queue i to CPU i; 7.3: queue 0 to CPU 1).
	q0, tid := -1, 0
	for _, q := range r.Sessions[0].Paths[0].Queues {
		if q.CPU == 0 {
			q0, tid = q.Queue, q.TID
		}
	}
	if q0 < 0 {
		t.Fatalf("no queue is polled on CPU 0: %+v", r.Sessions[0].Paths[0].Queues)
	}
	events, from, to := checkMigrations(t, r)
	t.Logf("fio on CPU 0: %d I/Os; completion events per queue %v; cpu_migration from %v to %v; queue %d polled on CPU 0",
		ios, events, from, to, q0)
	if sum(events[q0]) == 0 || sum(events[1-q0]) != 0 {
		t.Errorf("I/O from CPU 0 raised completion events %v: want them on queue %d (CPU 0's) only", events, q0)
	}

	// Move that queue's thread to CPU 1; its requests still come from CPU 0.
	labtest.Run(t, "taskset", "-p", "-c", "1", strconv.Itoa(tid))
	pinnedFio(t, dev, "randread", "8M", 0)
	r = c.statsJSON(true)
	labtest.Run(t, "taskset", "-p", "-c", "0", strconv.Itoa(tid))
	events, from, to = checkMigrations(t, r)
	t.Logf("queue %d's thread on CPU 1: completion events per queue %v; cpu_migration from %v to %v", q0, events, from, to)
	for _, p := range r.Sessions[0].Paths {
		for _, q := range p.Queues {
			if q.Queue == q0 && q.CPU != 1 {
				t.Errorf("path %d: queue %d polled on CPU %d after taskset, want 1", p.Index, q0, q.CPU)
			}
		}
	}
	if from[1] == 0 || from[1] != events[q0][0] || to[0] != events[q0][0] {
		t.Errorf("with queue %d's thread on CPU 1, cpu_migration from %v to %v: want its %d events on CPU 0 from CPU1 to CPU0",
			q0, from, to, events[q0][0])
	}
	text := c.must("stats")
	for _, want := range []string{"cpu_migration:", "from:", "to  :", "CPU0", "rdma rxe0: software device", fmt.Sprintf("queue %d (polled on CPU0", q0)} {
		if !strings.Contains(text, want) {
			t.Errorf("stats lacks %q:\n%s", want, text)
		}
	}

	// The session commands over RDMA, and the path commands under fio
	// verify. (The client daemon once died in the path disconnect: a
	// queue polled the CQ of the path's connections after giving them
	// back, while the path freed them; TestLabRDMAPathFlapUnderFio
	// repeats it.)
	c.must("session", "set", "max-reconnect-attempts", "cpus", "5")
	c.must("session", "set", "mp-policy", "cpus", "round-robin")
	fio := make(chan error, 1)
	go func() {
		res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "32M")...)
		if err == nil && res.Errors() != 0 {
			err = fmt.Errorf("%d errors: %s", res.Errors(), stderr)
		}
		fio <- err
	}()
	connected := func(n int) {
		t.Helper()
		if !labtest.WaitFor(30e9, func() bool { return strings.Count(c.must("path", "list"), " connected ") == n }) {
			t.Errorf("want %d connected paths:\n%s", n, c.must("path", "list"))
		}
	}
	c.must("path", "disconnect", "cpus", "1")
	connected(1)
	c.must("path", "reconnect", "cpus", "1")
	connected(2)
	if err := <-fio; err != nil {
		t.Fatalf("fio verify across RDMA path changes: %v", err)
	}
}

func sum(v []uint64) uint64 {
	var n uint64
	for _, x := range v {
		n += x
	}
	return n
}

// Without eBPF (--no-bpf, as on a kernel without BTF or without
// privilege) the statistics of urnbd's own counters still print, and each
// eBPF part says why it is missing.
func TestLabStatsWithoutBPF(t *testing.T) {
	c := newLabCLI(t)
	dir := imageDir(t, 16<<20)
	port := strconv.Itoa(startServerCLI(t, c, dir))
	dev := c.must("map", "--no-bpf", "sessname=nobpf", "dest_port="+port, "path=ip:127.0.0.1", "device_path=a.img")
	t.Cleanup(func() { c.run("unmap", "--force", dev) })
	c.statsJSON(true)
	reads := fixedIO(t, dev, "randread", "4M").Jobs[0].Read.IOs
	r := c.statsJSON(false)
	if got := r.Sessions[0].Paths[0].Stats.Read.Count; got != uint64(reads) {
		t.Errorf("RTRS counted %d reads without eBPF, fio did %d", got, reads)
	}
	if r.Devices[0].Latency != nil || !strings.Contains(r.Devices[0].LatencyOff, "--no-bpf") || !strings.Contains(r.EBPF.BlockLatency, "--no-bpf") {
		t.Errorf("without eBPF: device %+v, ebpf %+v", r.Devices[0], r.EBPF)
	}
	text := c.must("stats")
	for _, want := range []string{"rdma:", "rdma_lat:", "block latency: (eBPF unavailable: disabled by --no-bpf)", "ebpf: block latency disabled by --no-bpf"} {
		if !strings.Contains(text, want) {
			t.Errorf("stats without eBPF lacks %q:\n%s", want, text)
		}
	}
}

// flushes returns the flush requests a block device completed
// (/sys/block/NAME/stat, field 16).
func flushes(t *testing.T, name string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/sys/block/" + name + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 16 {
		t.Fatalf("/sys/block/%s/stat has %d fields", name, len(f))
	}
	n, _ := strconv.ParseUint(f[15], 10, 64)
	return n
}

// Flushes and FUA writes on the mapped device reach the server's backend:
// the server exports a loop device (which has a volatile write cache), and
// its flush count grows with the client's fsyncs and FUA writes, with
// either backend I/O mode.
func TestLabFlushAndFUAReachTheBackend(t *testing.T) {
	c := newLabCLI(t)
	labtest.NeedCommand(t, "losetup")
	img := filepath.Join(imageDir(t, 64<<20), "a.img")
	loop := strings.TrimSpace(labtest.Run(t, "losetup", "-f", "--show", img))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	name := filepath.Base(loop)
	for _, mode := range []string{"uring", "sync"} {
		t.Run(mode, func(t *testing.T) {
			dev := c.serveAndMapTCP(t, "/dev", "flush-"+mode, name, "--backend-io", mode)
			before := flushes(t, name)
			labtest.Run(t, "fio", "--name=fsync", "--filename="+dev, "--rw=write", "--bs=4k", "--size=64k",
				"--direct=1", "--ioengine=psync", "--fsync=1")
			afterFsync := flushes(t, name)
			labtest.Run(t, "dd", "if=/dev/zero", "of="+dev, "bs=4k", "count=16", "oflag=direct,dsync", "status=none")
			afterFUA := flushes(t, name)
			t.Logf("%s: loop flushes %d, after 16 fsyncs %d, after 16 FUA writes %d", mode, before, afterFsync, afterFUA)
			// The block layers on the way may merge a flush with another
			// (16 fsyncs made 15 flushes in a run); a FUA write on the
			// loop device becomes a flush before and one after.
			if afterFsync < before+12 || afterFUA < afterFsync+16 {
				t.Errorf("flushes on %s: %d before, %d after 16 fsyncs, %d after 16 FUA writes; want at least +12 and +16", loop, before, afterFsync, afterFUA)
			}
		})
	}
}

// serveAndMapTCP starts a server on a free loopback TCP port, exporting
// dir (with serverArgs), and maps name in session sess from it; the test's
// cleanup unmaps it and stops the server.
func (c *labCLI) serveAndMapTCP(t *testing.T, dir, sess, name string, serverArgs ...string) (dev string) {
	t.Helper()
	port := strconv.Itoa(freePort(t))
	srv := exec.Command(c.bin, append([]string{"server", "--listen", "tcp://127.0.0.1:" + port, "--dev-search-path", dir}, serverArgs...)...)
	srv.Env = append(os.Environ(), "URNBD_RUN_DIR="+c.runDir)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	if !labtest.WaitFor(10e9, func() bool {
		out, err := c.run("map", "sessname="+sess, "dest_port="+port, "path=ip:127.0.0.1", "device_path="+name)
		dev = out
		return err == nil
	}) {
		t.Fatalf("map: %s", dev)
	}
	t.Cleanup(func() { c.run("unmap", "--force", dev) })
	return dev
}

// mapOverTwoRDMAPaths starts a server on both lab RDMA paths at port,
// exporting a 128 MiB image, and maps it in session sess over both.
func (c *labCLI) mapOverTwoRDMAPaths(t *testing.T, sess string, port int) (dev string) {
	t.Helper()
	dir := imageDir(t, 128<<20)
	p := strconv.Itoa(port)
	srv := exec.Command(c.bin, "server", "--listen", "rdma://192.0.2.2:"+p, "--listen", "rdma://198.51.100.2:"+p, "--dev-search-path", dir)
	srv.Env = append(os.Environ(), "URNBD_RUN_DIR="+c.runDir)
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	if !labtest.WaitFor(10e9, func() bool {
		out, err := c.run("map", "sessname="+sess, "transport=rdma", "dest_port="+p, "path=ip:192.0.2.1@ip:192.0.2.2",
			"path=ip:198.51.100.1@ip:198.51.100.2", "device_path=a.img")
		dev = out
		return err == nil
	}) {
		t.Fatalf("map over RDMA: %s", dev)
	}
	t.Cleanup(func() { c.run("unmap", "--force", dev) })
	return dev
}

// TestLabRDMAPathFlapUnderFio disconnects and reconnects each RDMA path of
// a mapped device in turn, a few times, under fio verify: the client
// daemon must live through it (a queue once polled the CQ of a path the
// disconnect was freeing, and the daemon died: 2 runs in 3 with a daemon
// built with -race), fio must see no error and both paths must end
// connected. It takes 1–2 minutes in the emulated lab.
func TestLabRDMAPathFlapUnderFio(t *testing.T) {
	c := newLabCLI(t)
	provisionRDMA(t)
	dev := c.mapOverTwoRDMAPaths(t, "flap", 1251)
	c.must("session", "set", "mp-policy", "flap", "round-robin")

	// fio verify, again and again, until the paths are done flapping.
	var stop atomic.Bool
	fio := make(chan error, 1)
	go func() {
		for runs := 0; ; runs++ {
			res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "16M")...)
			if err == nil && res.Errors() != 0 {
				err = fmt.Errorf("%d errors: %s", res.Errors(), stderr)
			}
			if err != nil || stop.Load() {
				t.Logf("%d fio verify run(s)", runs+1)
				fio <- err
				return
			}
		}
	}()
	connected := func(n int) {
		t.Helper()
		if !labtest.WaitFor(30e9, func() bool { return strings.Count(c.must("path", "list"), " connected ") == n }) {
			t.Fatalf("want %d connected paths:\n%s", n, c.must("path", "list"))
		}
	}
	connected(2)
	const rounds = 4
	t0 := time.Now()
	for i := range rounds {
		idx := strconv.Itoa(i % 2)
		time.Sleep(500 * time.Millisecond) // I/O on both paths
		c.must("path", "disconnect", "flap", idx)
		connected(1)
		c.must("path", "reconnect", "flap", idx)
		connected(2)
	}
	t.Logf("%d path disconnects and reconnects under fio in %v", rounds, time.Since(t0).Round(time.Millisecond))
	stop.Store(true)
	if err := <-fio; err != nil {
		t.Fatalf("fio verify across RDMA path flaps: %v", err)
	}
}

// A write zeroes with NOUNMAP (RNBD 2.2) keeps the server's range
// allocated, one without it may free it: the client passes ublk's NOUNMAP
// on, and the server honours it where its file system cannot zero a range
// in place (the lab's /tmp is tmpfs: no ZERO_RANGE, only PUNCH_HOLE).
// BLKZEROOUT (blkdiscard -z) asks for NOUNMAP; a hole punched in the
// block device does not.
func TestLabWriteZeroesNoUnmapReachesTheBackend(t *testing.T) {
	c := newLabCLI(t)
	labtest.NeedCommand(t, "blkdiscard")
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	if err := os.WriteFile(img, bytes.Repeat([]byte{0xA5}, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Skipf("%s is not tmpfs: its files zero in place, NOUNMAP changes nothing to see", dir)
	}
	blocks := func() int64 {
		var s unix.Stat_t
		if err := unix.Stat(img, &s); err != nil {
			t.Fatal(err)
		}
		return s.Blocks
	}
	dev := c.serveAndMapTCP(t, dir, "zeroes", "a.img")
	full := blocks()
	labtest.Run(t, "blkdiscard", "-z", "-o", "0", "-l", strconv.Itoa(1<<20), dev)
	afterZeroout := blocks()
	labtest.Run(t, "fallocate", "--punch-hole", "-o", strconv.Itoa(2<<20), "-l", strconv.Itoa(1<<20), dev)
	afterPunch := blocks()
	t.Logf("backend blocks: %d, after BLKZEROOUT of 1 MiB %d, after a 1 MiB hole %d", full, afterZeroout, afterPunch)
	if afterZeroout != full {
		t.Errorf("BLKZEROOUT (NOUNMAP) changed the backend's blocks from %d to %d", full, afterZeroout)
	}
	if afterPunch >= afterZeroout {
		t.Errorf("a hole punched in the device left the backend's blocks at %d (before %d): want them freed", afterPunch, afterZeroout)
	}
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	if !bytes.Equal(got[:1<<20], zero) || !bytes.Equal(got[2<<20:3<<20], zero) || got[1<<20] != 0xA5 || got[3<<20] != 0xA5 {
		t.Error("the backend's zeroed ranges or the data around them are not as written")
	}
}
