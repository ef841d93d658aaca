//go:build linux

package bpf

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
)

// Lab tests: they need the lab kernel's modules (null_blk, ib_uverbs,
// rdma_rxe with soft-RoCE on 192.0.2.1 rxe0 <-> 192.0.2.2 rxe1). They run
// in tools/lab with URNBD_LAB=1 and skip on hosts without them.

var provisionOnce sync.Once

func provision(t *testing.T) {
	t.Helper()
	if labtest.InLab() {
		provisionOnce.Do(func() {
			labtest.Run(t, "../tools/lab/provision.sh", "modules")
			labtest.Run(t, "../tools/lab/provision.sh", "rdma")
		})
	}
}

// TestLabBlockLatency checks the block programs on the lab kernel (6.12)
// with null_blk.
func TestLabBlockLatency(t *testing.T) {
	provision(t)
	labtest.Need(t, "/dev/nullb0", "null_blk")
	needBPF(t)
	dev, err := DiskOf("/dev/nullb0")
	if err != nil {
		t.Fatal(err)
	}
	b := loadBlock(t, BlockLatencyOptions{Devices: []uint64{dev}})
	defer b.Close()
	// null_blk stores nothing unless loaded with memory_backed=1, which
	// another lab test may or may not have done first.
	directIO(t, "/dev/nullb0", 32, false)
	h, err := b.Histogram(dev)
	if err != nil {
		t.Fatal(err)
	}
	if h.Count[Read] != 32 || h.Count[Write] < 1 {
		t.Errorf("nullb0: reads %d (want 32), writes %d (want >= 1)", h.Count[Read], h.Count[Write])
	}
	var sb strings.Builder
	h.FormatLatUs(&sb)
	t.Logf("nullb0 µs:\n%s", sb.String())
}

// TestLabCompletionCPU runs two ibv_rc_pingpong processes with completion
// events over soft-RoCE and checks that the kprobe program saw their CQs'
// completions, per CPU and per CQ.
func TestLabCompletionCPU(t *testing.T) {
	provision(t)
	labtest.Need(t, "/sys/module/ib_uverbs", "ib_uverbs")
	labtest.Need(t, "/sys/class/infiniband/rxe0", "soft-RoCE rxe0: provision.sh rdma")
	labtest.Need(t, "/sys/class/infiniband/rxe1", "soft-RoCE rxe1: provision.sh rdma")
	pingpong := labtest.NeedCommand(t, "ibv_rc_pingpong")
	needBPF(t)

	pinDir := filepath.Join(bpfFSRoot, "urnbd-labtest")
	c, err := LoadCompletionCPU(Options{PinDir: pinDir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	gid0, gid1 := rocev2GID(t, "rxe0", "192.0.2.1"), rocev2GID(t, "rxe1", "192.0.2.2")
	const iters = 200
	server := exec.Command(pingpong, "-d", "rxe1", "-g", gid1, "-p", "18600", "-n", fmt.Sprint(iters), "-e")
	var sout strings.Builder
	server.Stdout, server.Stderr = &sout, &sout
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer server.Process.Kill()
	var out []byte
	ok := labtest.WaitFor(30*time.Second, func() bool {
		out, err = exec.Command(pingpong, "-d", "rxe0", "-g", gid0, "-p", "18600", "-n", fmt.Sprint(iters), "-e", "127.0.0.1").CombinedOutput()
		return err == nil
	})
	if !ok {
		t.Fatalf("ibv_rc_pingpong client: %v\n%s", err, out)
	}
	if err := server.Wait(); err != nil {
		t.Fatalf("ibv_rc_pingpong server: %v\n%s", err, sout.String())
	}
	t.Logf("client: %s", strings.TrimSpace(string(out)))

	perCPU, err := c.PerCPU()
	if err != nil {
		t.Fatal(err)
	}
	cqs, err := c.CQs()
	if err != nil {
		t.Fatal(err)
	}
	total, cqTotal := sum(perCPU), uint64(0)
	handles := map[uint64]bool{}
	for _, q := range cqs {
		cqTotal += q.Count
		handles[q.UserHandle] = true
		t.Logf("cq %#x (vector %d) on CPU %d: %d", q.UserHandle, q.CompVector, q.CPU, q.Count)
	}
	t.Logf("completion events per CPU: %v", perCPU)
	// Each process waits for a completion event per iteration, at least
	// for its receives: >= iters events each (events may cover several
	// completions).
	if total < iters {
		t.Errorf("completion events: %d, want >= %d", total, iters)
	}
	if cqTotal != total {
		t.Errorf("per-CQ counts sum to %d, per-CPU counts to %d", cqTotal, total)
	}
	if handles[0] {
		t.Errorf("a CQ with user_handle 0: the CO-RE read of cq->uobject failed")
	}
	if len(handles) < 1 {
		t.Errorf("no CQ seen")
	}

	// Every CQ expected on CPU 0: all completions elsewhere migrated.
	ncpu := len(perCPU)
	from, to := Migration(cqs, ncpu, func(uint64) (int, bool) { return 0, true })
	var away uint64
	for cpu := 1; cpu < ncpu; cpu++ {
		away += perCPU[cpu]
	}
	if from[0] != away || sum(to) != away || to[0] != 0 {
		t.Errorf("migration from %v to %v; %d completions were not on CPU 0", from, to, away)
	}
	var sb strings.Builder
	FormatCPUMigration(&sb, from, to)
	t.Logf("cpu_migration, all CQs expected on CPU 0:\n%s", sb.String())

	if bpftool, err := exec.LookPath("bpftool"); err == nil {
		out, err := exec.Command(bpftool, "map", "dump", "pinned", filepath.Join(pinDir, "urnbd_cq_cpu")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "user_handle") {
			t.Errorf("bpftool map dump urnbd_cq_cpu: %v\n%s", err, out)
		}
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if perCPU, _ := c.PerCPU(); sum(perCPU) != 0 {
		t.Errorf("after Reset: %v", perCPU)
	}
}

// rocev2GID returns the index of the RoCE v2 GID of ip on port 1 of dev.
func rocev2GID(t *testing.T, dev, ip string) string {
	t.Helper()
	var a, b, c, d int
	if _, err := fmt.Sscanf(ip, "%d.%d.%d.%d", &a, &b, &c, &d); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", a, b, c, d)
	port := filepath.Join("/sys/class/infiniband", dev, "ports/1")
	gids, _ := filepath.Glob(filepath.Join(port, "gids/*"))
	for _, g := range gids {
		v, err := os.ReadFile(g)
		if err != nil || strings.TrimSpace(string(v)) != want {
			continue
		}
		idx := filepath.Base(g)
		typ, err := os.ReadFile(filepath.Join(port, "gid_attrs/types", idx))
		if err == nil && strings.TrimSpace(string(typ)) == "RoCE v2" {
			return idx
		}
	}
	t.Fatalf("no RoCE v2 GID for %s on %s", ip, dev)
	return ""
}
