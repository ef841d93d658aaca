package rtrs

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// statsExample fills a 2-CPU client path with known values.
func statsExample() *ClientPathStats {
	s := NewClientPathStats(2)
	s.RecordRead(0, 4096+32)
	s.RecordRead(1, 4096+32)
	s.RecordWrite(1, 4128)
	s.RecordFailover(1)
	for range 4 {
		s.IncInflight()
	}
	s.DecInflight()
	s.ReconnectSucceeded() // first connect: -1 -> 0
	s.ReconnectSucceeded()
	s.ReconnectFailed()

	for range 3 {
		s.RecordCompletion(0, 1)
	}
	s.RecordCompletion(1, 0)
	s.RecordCompletion(1, 1) // on the expected CPU: not a migration

	for range 3 {
		s.RecordSGEntries(0, 1)
	}
	s.RecordSGEntries(0, 8)
	s.RecordSGEntries(1, 0)
	s.RecordSGEntries(1, 40)

	s.RecordReadLatency(0, 500*time.Microsecond) // < 1 ms
	s.RecordReadLatency(1, time.Millisecond)     // < 2 ms
	s.RecordReadLatency(1, 3*time.Millisecond)   // < 4 ms
	s.RecordReadLatency(0, 70*time.Second)       // >= 65536 ms
	s.RecordWriteLatency(1, 65535*time.Millisecond)

	s.RecordPoll(0, 4)
	s.RecordPoll(0, 2)
	s.RecordPoll(1, 9)
	s.RecordPoll(1, 0)
	return s
}

func statsEq(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	if string(got) != want {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

const exampleRdmaLat = "" +
	"<      1 ms: 1 0\n" +
	"<      2 ms: 1 0\n" +
	"<      4 ms: 1 0\n" +
	"<      8 ms: 0 0\n" +
	"<     16 ms: 0 0\n" +
	"<     32 ms: 0 0\n" +
	"<     64 ms: 0 0\n" +
	"<    128 ms: 0 0\n" +
	"<    256 ms: 0 0\n" +
	"<    512 ms: 0 0\n" +
	"<   1024 ms: 0 0\n" +
	"<   2048 ms: 0 0\n" +
	"<   4096 ms: 0 0\n" +
	"<   8192 ms: 0 0\n" +
	"<  16384 ms: 0 0\n" +
	"<  32768 ms: 0 0\n" +
	"<  65536 ms: 0 1\n" +
	">= 65536 ms: 1 0\n" +
	" maximum ms: 70000 65535\n"

const exampleSGEntries = "" +
	`n\cpu:    0    1` + "\n" +
	"=   0:    0 50.0\n" +
	"=   1: 75.0    0\n" +
	"=   2:    0    0\n" +
	"=   3:    0    0\n" +
	"=   4:    0    0\n" +
	"<   8:    0    0\n" +
	"<  16: 25.0    0\n" +
	"<  32:    0    0\n" +
	">= 32:    0 50.0\n" +
	"total: 4 2\n"

func TestClientStatsFormats(t *testing.T) {
	s := statsExample()
	statsEq(t, "rdma", s.AppendRdma(nil), "2 8256 1 4128 3 1\n")
	statsEq(t, "reconnects", s.AppendReconnects(nil), "1 1\n")
	statsEq(t, "cpu_migration_from", s.AppendCPUMigrationFrom(nil), "3 1 \n")
	statsEq(t, "cpu_migration_to", s.AppendCPUMigrationTo(nil), "1 3 \n")
	statsEq(t, "cpu_migration", s.AppendCPUMigration(nil), "     CPU0 CPU1\nfrom: 3 1\nto  : 1 3\n")
	statsEq(t, "sg_entries", s.AppendSGEntries(nil), exampleSGEntries)
	statsEq(t, "rdma_lat", s.AppendRdmaLat(nil), exampleRdmaLat)
	statsEq(t, "wc_completion", s.AppendWcCompletion(nil), "9 3\n") // max 9, 15/4 per run
	statsEq(t, "reset_all", s.AppendResetAll(nil), "echo 1 to reset all statistics\n")

	us := string(s.AppendRdmaLatUs(nil))
	for _, line := range []string{
		"<         1 us: 0 0\n",
		"<       512 us: 1 0\n", // 500 µs
		"<      1024 us: 1 0\n", // 1 ms
		"<      4096 us: 1 0\n", // 3 ms
		"<  67108864 us: 0 1\n", // 65.535 s (2^26 µs = 67.1 s)
		">= 67108864 us: 1 0\n", // 70 s
		" maximum us: 70000000 65535000\n",
	} {
		if !strings.Contains(us, line) {
			t.Errorf("rdma_lat_us lacks %q:\n%s", line, us)
		}
	}
	if n := strings.Count(us, "\n"); n != LatUsBuckets+1 {
		t.Errorf("rdma_lat_us has %d lines, want %d", n, LatUsBuckets+1)
	}
}

func TestClientStatsFresh(t *testing.T) {
	s := NewClientPathStats(3)
	statsEq(t, "rdma", s.AppendRdma(nil), "0 0 0 0 0 0\n")
	statsEq(t, "reconnects", s.AppendReconnects(nil), "-1 0\n")
	s.ReconnectSucceeded()
	statsEq(t, "reconnects after first connect", s.AppendReconnects(nil), "0 0\n")
	statsEq(t, "cpu_migration_from", s.AppendCPUMigrationFrom(nil), "0 0 0 \n")
	statsEq(t, "cpu_migration", s.AppendCPUMigration(nil), "     CPU0 CPU1 CPU2\nfrom: 0 0 0\nto  : 0 0 0\n")
	statsEq(t, "wc_completion", s.AppendWcCompletion(nil), "0 0\n")
	if !strings.HasPrefix(string(s.AppendSGEntries(nil)), `n\cpu:    0    1    2`+"\n=   0:    0    0    0\n") {
		t.Errorf("sg_entries: %q", s.AppendSGEntries(nil))
	}
	// Negative inflight prints as %u, as in the kernel.
	s.DecInflight()
	statsEq(t, "rdma with inflight -1", s.AppendRdma(nil), "0 0 0 0 4294967295 0\n")
}

// The rdma_lat rows follow the 5.6 ABI document: 1, 2, 4 ... 65536 ms,
// then ">= 65536 ms" and "maximum ms".
func TestRdmaLatMatchesABIDoc(t *testing.T) {
	doc := []string{"1 ms:", "2 ms:", "4 ms:", "8 ms:", "16 ms:"}
	for i := 5; i <= 16; i++ {
		doc = append(doc, fmt.Sprintf("%d ms:", 1<<i))
	}
	doc = append(doc, ">= 65536 ms:", "maximum ms:")
	lines := strings.Split(strings.TrimSuffix(string(NewClientPathStats(1).AppendRdmaLat(nil)), "\n"), "\n")
	if len(lines) != len(doc) {
		t.Fatalf("%d lines, doc has %d", len(lines), len(doc))
	}
	for i, l := range lines {
		label, counts, _ := strings.Cut(l, ": ")
		if !strings.HasSuffix(label+":", doc[i]) || counts != "0 0" {
			t.Errorf("line %d %q does not match doc %q <CNT-LAT-READ> <CNT-LAT-WRITE>", i, l, doc[i])
		}
	}
}

func TestSGBuckets(t *testing.T) {
	for _, c := range []struct{ n, row int }{
		{-1, 0}, {0, 0}, {1, 1}, {4, 4}, {5, 5}, {7, 5}, {8, 6}, {15, 6}, {16, 7}, {31, 7}, {32, 8}, {128, 8}, {1 << 30, 8},
	} {
		if got := sgBucket(c.n); got != c.row {
			t.Errorf("sgBucket(%d) = %d (%s), want %d (%s)", c.n, got, SGEntriesLabel(got), c.row, SGEntriesLabel(c.row))
		}
	}
	for _, c := range []struct{ ms uint64 }{{0}, {1}, {2}, {3}, {65535}, {65536}, {1 << 40}} {
		row := rdmaLatBucket(c.ms)
		// Row i < 17 holds [2^(i-1), 2^i) ms, row 0 [0, 1), row 17 [65536, ∞).
		lo, hi := uint64(0), uint64(1)<<row
		if row > 0 {
			lo = 1 << (row - 1)
		}
		if row == RdmaLatBuckets-1 {
			lo, hi = 65536, ^uint64(0)
		}
		if c.ms < lo || c.ms >= hi && row != RdmaLatBuckets-1 {
			t.Errorf("rdmaLatBucket(%d) = %d", c.ms, row)
		}
	}
}

func TestSGEntriesPercent(t *testing.T) {
	r := &ClientStatsSnapshot{
		SGDistr: [][SGEntriesBuckets]uint64{{1, 2, 0, 0, 0, 0, 0, 0, 0}},
		SGTotal: []uint64{3},
	}
	want := `n\cpu:    0` + "\n=   0: 33.3\n=   1: 66.6\n=   2:    0\n=   3:    0\n=   4:    0\n" +
		"<   8:    0\n<  16:    0\n<  32:    0\n>= 32:    0\ntotal: 3\n"
	statsEq(t, "sg_entries thirds", r.AppendSGEntries(nil), want)
}

func TestServerStatsFormats(t *testing.T) {
	s := NewServerPathStats(2)
	statsEq(t, "fresh rdma", s.AppendRdma(nil), "0 0 0 0\n")
	statsEq(t, "fresh wc_completion", s.AppendWcCompletion(nil), "0 0 0\n")
	s.RecordRead(0, 4096)
	s.RecordWrite(1, 4128)
	s.RecordWrite(0, 4128)
	s.RecordPoll(0, 3)
	s.RecordPoll(1, 5)
	s.IncInflight()
	statsEq(t, "rdma", s.AppendRdma(nil), "1 4096 2 8256\n")
	statsEq(t, "wc_completion", s.AppendWcCompletion(nil), "5 8 2\n")
	statsEq(t, "reset_all", s.AppendResetAll(nil), "echo 1 to reset all statistics\n")
	if s.Inflight() != 1 {
		t.Errorf("inflight %d", s.Inflight())
	}

	if err := s.Reset("reset_all", "1\n"); err != nil {
		t.Fatal(err)
	}
	statsEq(t, "rdma after reset_all", s.AppendRdma(nil), "0 0 0 0\n")
	statsEq(t, "wc_completion after reset_all", s.AppendWcCompletion(nil), "0 0 0\n")
	if s.Inflight() != 1 {
		t.Errorf("reset_all touched inflight: %d", s.Inflight())
	}
	for _, in := range []string{"0", "", "2", " 1", "1\n\n", "yes"} {
		if err := s.Reset("rdma", in); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Reset(rdma, %q) = %v, want EINVAL", in, err)
		}
	}
	if err := s.Reset("reconnects", "1"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("server Reset(reconnects) = %v, want ENOENT", err)
	}
}

func TestStatFiles(t *testing.T) {
	s := statsExample()
	var names, linux []string
	for _, f := range s.StatFiles() {
		names = append(names, f.Name)
		if f.Linux612 {
			linux = append(linux, f.Name)
		}
		var buf bytes.Buffer
		if err := f.Format(&buf); err != nil {
			t.Fatal(err)
		}
		if got := f.Append([]byte("x")); string(got[1:]) != buf.String() || got[0] != 'x' {
			t.Errorf("%s: Append %q, Format %q", f.Name, got, buf.String())
		}
		if !strings.HasSuffix(buf.String(), "\n") {
			t.Errorf("%s: no trailing newline", f.Name)
		}
	}
	if got := strings.Join(linux, " "); got != "cpu_migration_from cpu_migration_to reconnects rdma reset_all" {
		t.Errorf("6.12 client files: %s", got)
	}
	if got := strings.Join(names[len(linux):], " "); got != "sg_entries cpu_migration rdma_lat rdma_lat_us wc_completion" {
		t.Errorf("5.6 client files: %s", got)
	}
	var srv []string
	for _, f := range NewServerPathStats(1).StatFiles() {
		srv = append(srv, fmt.Sprint(f.Name, "/", f.Linux612))
	}
	if got := strings.Join(srv, " "); got != "rdma/true wc_completion/false reset_all/false" {
		t.Errorf("server files: %s", got)
	}
}

func TestClientReset(t *testing.T) {
	all := func(s *ClientPathStats) map[string]string {
		m := map[string]string{}
		for _, f := range s.StatFiles() {
			m[f.Name] = string(f.Append(nil))
		}
		return m
	}
	fresh := all(NewClientPathStats(2))
	fresh["reconnects"] = "0 0\n" // a reset zeroes, it does not restore -1

	// Each file's reset clears exactly that file (cpu_migration*: all three).
	resets := map[string][]string{
		"rdma":               {"rdma"},
		"reconnects":         {"reconnects"},
		"cpu_migration_from": {"cpu_migration_from", "cpu_migration_to", "cpu_migration"},
		"cpu_migration_to":   {"cpu_migration_from", "cpu_migration_to", "cpu_migration"},
		"cpu_migration":      {"cpu_migration_from", "cpu_migration_to", "cpu_migration"},
		"sg_entries":         {"sg_entries"},
		"rdma_lat":           {"rdma_lat", "rdma_lat_us"},
		"rdma_lat_us":        {"rdma_lat", "rdma_lat_us"},
		"wc_completion":      {"wc_completion"},
	}
	for name, cleared := range resets {
		s := statsExample()
		before := all(s)
		if err := s.Reset(name, "1\n"); err != nil {
			t.Fatalf("Reset(%s): %v", name, err)
		}
		after := all(s)
		for file, text := range after {
			want := before[file]
			for _, c := range cleared {
				if c == file {
					want = fresh[file]
				}
			}
			if file == "rdma" && name == "rdma" {
				want = "0 0 0 0 3 0\n" // inflight survives
			}
			if text != want {
				t.Errorf("after Reset(%s): %s = %q, want %q", name, file, text, want)
			}
		}
	}

	s := statsExample()
	if err := s.Reset("reset_all", "1"); err != nil {
		t.Fatal(err)
	}
	fresh["rdma"] = "0 0 0 0 0 0\n"
	for file, text := range all(s) {
		if text != fresh[file] {
			t.Errorf("after reset_all: %s = %q, want %q", file, text, fresh[file])
		}
	}
	if s.Inflight() != 0 {
		t.Errorf("inflight %d after reset_all", s.Inflight())
	}

	for _, name := range []string{"rdma", "reconnects", "cpu_migration_from", "cpu_migration_to", "reset_all", "sg_entries", "wc_completion", "cpu_migration"} {
		for _, in := range []string{"0", "0\n", "", "2", " 1", "1 ", "1\n\n", "true"} {
			if err := s.Reset(name, in); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("Reset(%s, %q) = %v, want EINVAL", name, in, err)
			}
		}
	}
	if err := s.Reset("state", "1"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Reset(state) = %v, want ENOENT", err)
	}

	// rdma_lat: 0 switches collection off, 1 resets and switches it on.
	s = statsExample()
	if err := s.Reset("rdma_lat", "0\n"); err != nil || s.LatencyEnabled() {
		t.Fatalf("Reset(rdma_lat, 0) = %v, enabled %v", err, s.LatencyEnabled())
	}
	s.RecordReadLatency(0, time.Second)
	statsEq(t, "rdma_lat while off", s.AppendRdmaLat(nil), exampleRdmaLat)
	if err := s.Reset("rdma_lat", "2"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("Reset(rdma_lat, 2) = %v", err)
	}
	if err := s.Reset("rdma_lat", "1"); err != nil || !s.LatencyEnabled() {
		t.Fatalf("Reset(rdma_lat, 1) = %v, enabled %v", err, s.LatencyEnabled())
	}
	s.RecordReadLatency(0, time.Second)
	if got := string(s.AppendRdmaLat(nil)); !strings.Contains(got, "<   1024 ms: 1 0\n") || !strings.Contains(got, " maximum ms: 1000 0\n") {
		t.Errorf("rdma_lat after re-enable:\n%s", got)
	}
}

func TestStatsCPUOutOfRange(t *testing.T) {
	s := NewClientPathStats(4)
	for _, cpu := range []int{-1, 4, 7, 1 << 40} {
		s.RecordRead(cpu, 1)
		s.RecordCompletion(cpu, 2)
		s.RecordSGEntries(cpu, 1)
		s.RecordPoll(cpu, 1)
		s.RecordWriteLatency(cpu, time.Microsecond)
	}
	if r := s.Snapshot(); r.Read.Count != 4 || r.Wc.Calls != 4 {
		t.Errorf("lost updates: %+v", r)
	}
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-7": 8, "0-3,8-11": 12, "0,2": 3, "": 0, "x": 0, "3-1": 0, "0-": 0} {
		if got := parseCPUList(in); got != want {
			t.Errorf("parseCPUList(%q) = %d, want %d", in, got, want)
		}
	}
	if StatsPossibleCPUs() < 1 {
		t.Error("no CPUs")
	}
	if NewClientPathStats(0).NumCPU() != StatsPossibleCPUs() || NewServerPathStats(-1).NumCPU() != StatsPossibleCPUs() {
		t.Error("default slot count")
	}
}

func TestStatsSlotLayout(t *testing.T) {
	for name, sz := range map[string]uintptr{
		"client": unsafe.Sizeof(clientCPUSlot{}),
		"server": unsafe.Sizeof(serverCPUSlot{}),
	} {
		if sz%statsCacheLine != 0 {
			t.Errorf("%s slot size %d is not a multiple of %d", name, sz, statsCacheLine)
		}
	}
	if off := unsafe.Offsetof(clientCPUSlot{}.clientCPU); off < statsCacheLine {
		t.Errorf("client counters at offset %d", off)
	}
}

// Many goroutines update their own CPU slots (two per slot, so adds on one
// slot race too) while readers render every file and the metrics; the
// totals must come out exact. Run with -race.
func TestStatsConcurrent(t *testing.T) {
	const ncpu, perCPU, iters = 8, 2, 2000
	s := NewClientPathStats(ncpu)
	srv := NewServerPathStats(ncpu)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			var b []byte
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, f := range s.StatFiles() {
					b = f.Append(b[:0])
				}
				for _, f := range srv.StatFiles() {
					b = f.Append(b[:0])
				}
				b = s.AppendPrometheus(b[:0], "sess", "a@b")
				b = srv.AppendPrometheus(b[:0], "sess", "a@b")
				_ = s.Inflight()
			}
		})
	}
	var writers sync.WaitGroup
	for g := range ncpu * perCPU {
		cpu := g % ncpu
		writers.Go(func() {
			for i := range iters {
				s.IncInflight()
				s.RecordRead(cpu, 4096)
				s.RecordWrite(cpu, 512)
				s.RecordSGEntries(cpu, i%40)
				s.RecordReadLatency(cpu, time.Duration(i)*time.Microsecond)
				s.RecordWriteLatency(cpu, time.Duration(i)*time.Millisecond)
				s.RecordCompletion(cpu, (cpu+i)%ncpu)
				s.RecordPoll(cpu, i%16)
				s.RecordFailover(cpu)
				s.DecInflight()
				srv.RecordRead(cpu, 4096)
				srv.RecordWrite(cpu, 512)
				srv.RecordPoll(cpu, i%16)
				srv.IncInflight()
				srv.DecInflight()
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()

	const n = ncpu * perCPU * iters
	r := s.Snapshot()
	var migr, sg, lat uint64
	for cpu := range ncpu {
		migr += r.MigrationTo[cpu]
		sg += r.SGTotal[cpu]
	}
	for _, v := range r.LatMs {
		lat += v.Read + v.Write
	}
	wantMigr := uint64(ncpu * perCPU * (iters - iters/ncpu))
	if r.Read.Count != n || r.Read.Bytes != n*4096 || r.Write.Count != n || r.Write.Bytes != n*512 ||
		r.Failovers != n || r.Inflight != 0 || sg != n || lat != 2*n || r.Wc.Calls != n || r.Wc.Max != 15 || migr != wantMigr {
		t.Errorf("client totals wrong: %+v (migr %d want %d, sg %d, lat %d)", r, migr, wantMigr, sg, lat)
	}
	statsEq(t, "server rdma", srv.AppendRdma(nil), fmt.Sprintf("%d %d %d %d\n", n, n*4096, n, n*512))
	if sr := srv.Snapshot(); sr.Wc.Calls != n || sr.Wc.Max != 15 || sr.Inflight != 0 {
		t.Errorf("server totals wrong: %+v", sr)
	}
}

func TestStatsUpdatesDoNotAllocate(t *testing.T) {
	s := NewClientPathStats(4)
	srv := NewServerPathStats(4)
	for name, f := range map[string]func(){
		"RecordRead":         func() { s.RecordRead(1, 4096) },
		"RecordWrite":        func() { s.RecordWrite(2, 4096) },
		"RecordSGEntries":    func() { s.RecordSGEntries(3, 9) },
		"IncInflight":        func() { s.IncInflight() },
		"DecInflight":        func() { s.DecInflight() },
		"Inflight":           func() { _ = s.Inflight() },
		"RecordFailover":     func() { s.RecordFailover(0) },
		"ReconnectSucceeded": func() { s.ReconnectSucceeded() },
		"ReconnectFailed":    func() { s.ReconnectFailed() },
		"RecordCompletion":   func() { s.RecordCompletion(0, 3) },
		"RecordPoll":         func() { s.RecordPoll(1, 7) },
		"RecordReadLatency":  func() { s.RecordReadLatency(1, 30*time.Microsecond) },
		"RecordWriteLatency": func() { s.RecordWriteLatency(2, 3*time.Millisecond) },
		"LatencyEnabled":     func() { _ = s.LatencyEnabled() },
		"srv.RecordRead":     func() { srv.RecordRead(1, 4096) },
		"srv.RecordWrite":    func() { srv.RecordWrite(1, 4096) },
		"srv.RecordPoll":     func() { srv.RecordPoll(1, 3) },
		"srv.IncInflight":    func() { srv.IncInflight() },
		"srv.DecInflight":    func() { srv.DecInflight() },
	} {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s: %v allocs per run", name, a)
		}
	}
}

func TestPrometheus(t *testing.T) {
	s := statsExample()
	out := string(AppendClientPrometheus(nil, []PromClientPath{
		{"blya", "ip:10.0.0.1@ip:10.0.0.2", s.Snapshot()},
		{`we"ird\`, "a\nb", NewClientPathStats(2).Snapshot()},
		{"skipped", "x", nil},
	}))
	l := `sess="blya",path="ip:10.0.0.1@ip:10.0.0.2"`
	for _, line := range []string{
		"# TYPE urnbd_rtrs_client_read_requests_total counter\n",
		"urnbd_rtrs_client_read_requests_total{" + l + "} 2\n",
		"urnbd_rtrs_client_read_bytes_total{" + l + "} 8256\n",
		"urnbd_rtrs_client_write_bytes_total{" + l + "} 4128\n",
		"urnbd_rtrs_client_inflight{" + l + "} 3\n",
		"urnbd_rtrs_client_failovers_total{" + l + "} 1\n",
		"urnbd_rtrs_client_reconnects{" + l + `,result="successful"} 1` + "\n",
		"urnbd_rtrs_client_reconnects{" + l + `,result="failed"} 1` + "\n",
		`urnbd_rtrs_client_reconnects{sess="we\"ird\\",path="a\nb",result="successful"} -1` + "\n",
		"urnbd_rtrs_client_cpu_migration_from_total{" + l + `,cpu="0"} 3` + "\n",
		"urnbd_rtrs_client_cpu_migration_to_total{" + l + `,cpu="1"} 3` + "\n",
		"# TYPE urnbd_rtrs_client_sg_entries histogram\n",
		"urnbd_rtrs_client_sg_entries_bucket{" + l + `,le="0"} 1` + "\n",
		"urnbd_rtrs_client_sg_entries_bucket{" + l + `,le="1"} 4` + "\n",
		"urnbd_rtrs_client_sg_entries_bucket{" + l + `,le="15"} 5` + "\n",
		"urnbd_rtrs_client_sg_entries_bucket{" + l + `,le="+Inf"} 6` + "\n",
		"urnbd_rtrs_client_sg_entries_sum{" + l + "} 51\n",
		"urnbd_rtrs_client_sg_entries_count{" + l + "} 6\n",
		"urnbd_rtrs_client_request_latency_seconds_bucket{" + l + `,dir="read",le="1e-06"} 0` + "\n",
		"urnbd_rtrs_client_request_latency_seconds_bucket{" + l + `,dir="read",le="0.000512"} 1` + "\n",
		"urnbd_rtrs_client_request_latency_seconds_bucket{" + l + `,dir="read",le="0.002048"} 2` + "\n",
		"urnbd_rtrs_client_request_latency_seconds_bucket{" + l + `,dir="read",le="+Inf"} 4` + "\n",
		"urnbd_rtrs_client_request_latency_seconds_sum{" + l + `,dir="read"} 70.0045` + "\n",
		"urnbd_rtrs_client_request_latency_seconds_count{" + l + `,dir="write"} 1` + "\n",
		"urnbd_rtrs_client_request_latency_max_seconds{" + l + `,dir="write"} 65.535` + "\n",
		"urnbd_rtrs_client_wc_completion_max{" + l + "} 9\n",
		"urnbd_rtrs_client_work_completions_total{" + l + "} 15\n",
		"urnbd_rtrs_client_completion_polls_total{" + l + "} 4\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("metrics lack %q", line)
		}
	}
	if strings.Contains(out, "skipped") {
		t.Error("nil stats rendered")
	}
	// Each family once, and all its samples right after its TYPE line.
	seen := map[string]bool{}
	family := ""
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			family, _, _ = strings.Cut(rest, " ")
			if seen[family] {
				t.Errorf("family %s twice", family)
			}
			seen[family] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		if !strings.HasPrefix(line, family) {
			t.Errorf("sample %q outside its family %s", line, family)
		}
	}

	srv := NewServerPathStats(2)
	srv.RecordWrite(0, 4128)
	srv.RecordPoll(1, 5)
	so := string(srv.AppendPrometheus(nil, "blya", "ip:10.0.0.2@ip:10.0.0.1"))
	sl := `sess="blya",path="ip:10.0.0.2@ip:10.0.0.1"`
	for _, line := range []string{
		"urnbd_rtrs_server_write_requests_total{" + sl + "} 1\n",
		"urnbd_rtrs_server_write_bytes_total{" + sl + "} 4128\n",
		"urnbd_rtrs_server_read_requests_total{" + sl + "} 0\n",
		"urnbd_rtrs_server_wc_completion_max{" + sl + "} 5\n",
		"urnbd_rtrs_server_completion_polls_total{" + sl + "} 1\n",
	} {
		if !strings.Contains(so, line) {
			t.Errorf("server metrics lack %q", line)
		}
	}
}
