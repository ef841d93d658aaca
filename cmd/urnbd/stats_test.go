package main

import (
	"strings"
	"testing"
	"time"

	"github.com/urnbd/urnbd/bpf"
	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
)

// testReport is a report with one RDMA path (migrations from eBPF), one
// TCP path, a device with a latency histogram and a hardware RDMA device.
func testReport() *statsReport {
	st := rtrs.NewClientPathStats(2)
	st.RecordRead(0, 4096)
	st.RecordReadLatency(0, 300*time.Microsecond)
	st.RecordSGEntries(0, 1)
	rdmaSnap := st.Snapshot()
	rdmaSnap.MigrationFrom, rdmaSnap.MigrationTo = []uint64{5, 0}, []uint64{0, 5}
	h := &bpf.Histogram{}
	h.Us[bpf.Read][9], h.Count[bpf.Read], h.SumNs[bpf.Read], h.MaxNs[bpf.Read] = 3, 3, 3*300000, 400000
	h.Ms[bpf.Read][0] = 3
	return &statsReport{
		Sessions: []sessionReport{
			{Name: "s1", Transport: "rdma", Paths: []pathReport{{Index: 0, Addr: "192.0.2.1@192.0.2.2:1234", State: "connected",
				CurLatencyNs: 12345, Stats: rdmaSnap, CPUMigration: "ebpf"}}},
			{Name: "s2", Transport: "tcp", Paths: []pathReport{{Index: 0, Addr: "127.0.0.1:1234", State: "connected",
				Stats: rtrs.NewClientPathStats(2).Snapshot(), CPUMigration: "not measured over TCP"}}},
		},
		Devices: []deviceReport{{Device: "/dev/ublkb0", SessName: "s1", MapPath: "disk.img", Latency: h}},
		IRQs: []rdma.DeviceIRQs{{Device: "mlx5_0", IRQs: []rdma.IRQ{{Num: 45, Name: "mlx5_comp0@pci:0000:3b:00.0", Affinity: "1", PerCPU: []uint64{0, 7}}}},
			{Device: "rxe0", Software: true}},
		EBPF: ebpfReport{BlockLatency: "on", CompletionCPU: "on"},
	}
}

func TestStatsText(t *testing.T) {
	text := string(testReport().appendText(nil))
	for _, want := range []string{
		"session s1 (rdma) path 0 192.0.2.1@192.0.2.2:1234 (connected)\n",
		"  cur_latency:         12345 ns\n",
		"  cpu_migration_from:  5 0 \n",
		"  cpu_migration_to:    0 5 \n",
		"  rdma:                1 4096 0 0 0 0\n",
		"  cpu_migration:\n           CPU0 CPU1\n      from: 5 0\n      to  : 0 5\n",
		"  cpu_migration_from:  (not measured over TCP)\n",
		"device /dev/ublkb0 (session s1, disk.img)\n  requests (eBPF):     3 0 0\n",
		"      <      1 ms: 3 0\n",
		"irq 45 mlx5_comp0@pci:0000:3b:00.0: affinity 1",
		"rdma rxe0: software device, no completion interrupts",
		"ebpf: block latency on; completion CPU on\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
}

func TestStatsPrometheus(t *testing.T) {
	prom := string(testReport().appendPrometheus(nil))
	for _, want := range []string{
		"# TYPE urnbd_block_latency_seconds histogram\n",
		`urnbd_block_latency_seconds_bucket{device="/dev/ublkb0",sess="s1",dir="read",le="0.000256"} 0` + "\n",
		`urnbd_block_latency_seconds_bucket{device="/dev/ublkb0",sess="s1",dir="read",le="0.000512"} 3` + "\n",
		`urnbd_block_latency_seconds_sum{device="/dev/ublkb0",sess="s1",dir="read"} 0.0009` + "\n",
		`urnbd_block_latency_seconds_count{device="/dev/ublkb0",sess="s1",dir="read"} 3` + "\n",
		`urnbd_rtrs_client_cpu_migration_from_total{sess="s1",path="192.0.2.1@192.0.2.2:1234",cpu="0"} 5` + "\n",
		`urnbd_ebpf_up{program="block_latency"} 1` + "\n",
	} {
		if !strings.Contains(prom, want) {
			t.Errorf("metrics lack %q:\n%s", want, prom)
		}
	}
	// Every family has one TYPE line.
	seen := map[string]bool{}
	for _, l := range strings.Split(prom, "\n") {
		if name, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, _, _ = strings.Cut(name, " ")
			if seen[name] {
				t.Errorf("family %s has two TYPE lines", name)
			}
			seen[name] = true
		}
	}
}

func TestTraceFrame(t *testing.T) {
	prev, cur := testReport(), testReport()
	cur.Devices[0].Latency.Us[bpf.Read][9] += 10
	cur.Devices[0].Latency.Count[bpf.Read] += 10
	cur.Devices[0].Latency.SumNs[bpf.Read] += 10 * 400000
	cur.Sessions[0].Paths[0].Stats.MigrationFrom = []uint64{9, 0}
	out := string(appendTraceFrame(nil, prev, cur, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), 2*time.Second))
	for _, want := range []string{
		"urnbd trace 12:00:00, last 2.0s\n",
		"  IOPS read 5 write 0 other 0; avg read 400 µs\n",
		"256 -> 511        10 ******************************",
		"    from: 4 0\n",
		"cpu_migration: not measured over TCP\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("trace frame lacks %q:\n%s", want, out)
		}
	}
}
