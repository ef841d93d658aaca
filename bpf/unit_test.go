//go:build linux

package bpf

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestDevConversion(t *testing.T) {
	for _, d := range []struct{ major, minor uint32 }{{254, 0}, {8, 17}, {259, 1 << 19}, {4095, 1<<20 - 1}} {
		dev := unix.Mkdev(d.major, d.minor)
		k := kernelDev(dev)
		if k != d.major<<20|d.minor {
			t.Errorf("kernelDev(%d:%d) = %#x", d.major, d.minor, k)
		}
		if back := userDev(k); back != dev {
			t.Errorf("userDev(kernelDev(%d:%d)) = %s", d.major, d.minor, DevName(back))
		}
	}
	if dev, err := parseDev("254:16"); err != nil || dev != unix.Mkdev(254, 16) {
		t.Errorf("parseDev: %s, %v", DevName(dev), err)
	}
	if _, err := parseDev("vda"); err == nil {
		t.Error("parseDev(vda) succeeded")
	}
}

func TestDiskOfNotBlock(t *testing.T) {
	if _, err := DiskOf("/proc/self/stat"); err == nil {
		t.Error("DiskOf(/proc/self/stat) succeeded")
	}
}

func TestMigration(t *testing.T) {
	counts := []CQCount{
		{UserHandle: 1, CPU: 0, Count: 10}, // on its CPU
		{UserHandle: 1, CPU: 1, Count: 3},  // 0 -> 1
		{UserHandle: 2, CPU: 0, Count: 4},  // 1 -> 0
		{UserHandle: 2, CPU: 1, Count: 7},
		{UserHandle: 3, CPU: 1, Count: 99}, // unknown CQ
	}
	expected := map[uint64]int{1: 0, 2: 1}
	from, to := Migration(counts, 2, func(h uint64) (int, bool) { c, ok := expected[h]; return c, ok })
	if from[0] != 3 || from[1] != 4 || to[0] != 4 || to[1] != 3 {
		t.Errorf("from %v, to %v", from, to)
	}
	var b strings.Builder
	if err := FormatCPUMigration(&b, from, to); err != nil {
		t.Fatal(err)
	}
	if want := "     CPU0 CPU1\nfrom: 3 4\nto  : 4 3\n"; b.String() != want {
		t.Errorf("cpu_migration:\n%q\nwant\n%q", b.String(), want)
	}
}

func TestHistogramFormat(t *testing.T) {
	var h Histogram
	h.Ms[Read][0], h.Ms[Write][0], h.Ms[Write][3] = 5, 2, 1
	h.Ms[Other][0] = 100 // not in rdma_lat
	h.MaxNs[Read], h.MaxNs[Write] = 900_000, 5_500_000
	h.Us[Read][10], h.Us[Write][13] = 5, 3
	got := string(h.AppendRdmaLat(nil))
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != RdmaLatBuckets+1 {
		t.Fatalf("%d lines:\n%s", len(lines), got)
	}
	for i, want := range map[int]string{
		0:                  "<      1 ms: 5 2",
		3:                  "<      8 ms: 0 1",
		RdmaLatBuckets - 1: ">= 65536 ms: 0 0",
		RdmaLatBuckets:     " maximum ms: 0 5",
	} {
		if lines[i] != want {
			t.Errorf("line %d: %q, want %q", i, lines[i], want)
		}
	}
	us := string(h.AppendLatUs(nil))
	for _, want := range []string{"<      1024 us: 5 0\n", "<      8192 us: 0 3\n", " maximum us: 900 5500\n"} {
		if !strings.Contains(us, want) {
			t.Errorf("µs table lacks %q:\n%s", want, us)
		}
	}
	if h.Total(Read) != 5 || h.Total(Write) != 3 {
		t.Errorf("totals %d %d", h.Total(Read), h.Total(Write))
	}
}
