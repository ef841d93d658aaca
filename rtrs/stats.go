package rtrs

import (
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"
)

// Statistics of RTRS paths.
//
// A ClientPathStats and a ServerPathStats hold the counters behind the
// files of a path's stats directory (/sys/class/rtrs-client/<sess>/paths/
// <src@dst>/stats/ and its server twin). They keep both what Linux 6.12
// prints (rdma, reconnects, cpu_migration_from, cpu_migration_to,
// reset_all) and the files of the original 5.6 ABI documentation that the
// kernel no longer has (sg_entries, rdma_lat, wc_completion, the
// cpu_migration table); see StatFiles.
//
// Counters live in per-CPU slots, one cache-line padded struct per CPU,
// indexed by the CPU the counting code runs on as given by the caller (the
// queue thread pinned to that CPU knows it). Updates are single atomic adds
// on the caller's slot (so readers and the race detector are happy, and a
// stray CPU number costs correctness of nothing but attribution), never
// allocate and take no lock. Readers sum over all slots; a read racing with
// updates sees each counter atomically but not a snapshot of all of them,
// exactly like the kernel's per-CPU sums.

// Bucket counts of the histograms.
const (
	// SGEntriesBuckets is the number of rows of sg_entries: "= 0" to "= 4",
	// "< 8", "< 16", "< 32" and ">= 32" (kernel SG_DISTR_SZ with
	// MIN_LOG_SG 2, MAX_LOG_SG 5, MAX_LIN_SG 4).
	SGEntriesBuckets = 9
	// RdmaLatBuckets is the number of millisecond buckets of rdma_lat:
	// "< 1 ms" to "< 65536 ms" (log2) and ">= 65536 ms" (kernel LOG_LAT_SZ
	// with MIN_LOG_LAT 0, MAX_LOG_LAT 16).
	RdmaLatBuckets = 18
	// LatUsBuckets is the number of microsecond buckets of the fine
	// latency histogram (not a kernel file; used for Prometheus and
	// FormatRdmaLatUs): bucket k < 27 counts latencies below 2^k µs,
	// the last one those of 2^26 µs (about 67 s) and more.
	LatUsBuckets = 28
)

const (
	statsRead  = 0
	statsWrite = 1

	sgMaxLin = 4 // MAX_LIN_SG
	sgMinLog = 2 // MIN_LOG_SG
)

// statsDir counts requests and bytes of one direction.
type statsDir struct {
	cnt   atomic.Uint64
	bytes atomic.Uint64
}

// clientCPU is one CPU's share of a client path's counters.
type clientCPU struct {
	rdma     [2]statsDir // read, write
	failover atomic.Uint64
	migrFrom atomic.Uint64 // completions expected on this CPU, handled elsewhere
	migrTo   atomic.Uint64 // completions handled on this CPU unexpectedly

	sgTotal atomic.Uint64
	sgSum   atomic.Uint64
	sg      [SGEntriesBuckets]atomic.Uint64

	latMs    [RdmaLatBuckets][2]atomic.Uint64
	latUs    [LatUsBuckets][2]atomic.Uint64
	latSumNs [2]atomic.Uint64
	latMaxNs [2]atomic.Uint64

	wcCalls atomic.Uint64
	wcTotal atomic.Uint64
	wcMax   atomic.Uint64
}

type clientCPUSlot struct {
	_ [statsCacheLine]byte
	clientCPU
	_ [(statsCacheLine - unsafe.Sizeof(clientCPU{})%statsCacheLine) % statsCacheLine]byte
}

// serverCPU is one CPU's share of a server path's counters.
type serverCPU struct {
	rdma    [2]statsDir
	wcCalls atomic.Uint64
	wcTotal atomic.Uint64
	wcMax   atomic.Uint64
}

type serverCPUSlot struct {
	_ [statsCacheLine]byte
	serverCPU
	_ [(statsCacheLine - unsafe.Sizeof(serverCPU{})%statsCacheLine) % statsCacheLine]byte
}

// ClientPathStats are the statistics of one client path. Create them with
// NewClientPathStats; all methods are safe for concurrent use.
type ClientPathStats struct {
	cpus []clientCPUSlot

	_          [statsCacheLine]byte
	inflight   atomic.Int32 // read by the min-inflight policy on every I/O
	_          [statsCacheLine - 4]byte
	reconnOK   atomic.Int32
	reconnFail atomic.Int32
	latOff     atomic.Bool // rdma_lat collection switched off by writing 0
}

// NewClientPathStats returns zeroed statistics with ncpu per-CPU slots
// (ncpu <= 0 means StatsPossibleCPUs()). The successful reconnect count
// starts at -1, as in the kernel: the first connect brings it to 0.
func NewClientPathStats(ncpu int) *ClientPathStats {
	if ncpu <= 0 {
		ncpu = StatsPossibleCPUs()
	}
	s := &ClientPathStats{cpus: make([]clientCPUSlot, ncpu)}
	s.reconnOK.Store(-1)
	return s
}

// NumCPU is the number of per-CPU slots (columns of the per-CPU files).
func (s *ClientPathStats) NumCPU() int { return len(s.cpus) }

func (s *ClientPathStats) slot(cpu int) *clientCPU {
	return &s.cpus[statsCPU(cpu, len(s.cpus))].clientCPU
}

// RecordRead counts a READ request submitted on cpu; bytes is usr_len +
// data_len of the request, as the kernel counts it.
func (s *ClientPathStats) RecordRead(cpu int, bytes uint64) {
	d := &s.slot(cpu).rdma[statsRead]
	d.cnt.Add(1)
	d.bytes.Add(bytes)
}

// RecordWrite counts a WRITE request submitted on cpu; bytes is usr_len +
// data_len.
func (s *ClientPathStats) RecordWrite(cpu int, bytes uint64) {
	d := &s.slot(cpu).rdma[statsWrite]
	d.cnt.Add(1)
	d.bytes.Add(bytes)
}

// RecordSGEntries counts a request whose scatter-gather list has n
// entries in the sg_entries distribution of cpu.
func (s *ClientPathStats) RecordSGEntries(cpu, n int) {
	c := s.slot(cpu)
	c.sg[sgBucket(n)].Add(1)
	c.sgTotal.Add(1)
	if n > 0 {
		c.sgSum.Add(uint64(n))
	}
}

// sgBucket is the sg_entries row of a list of n entries (kernel
// rtrs_clt_record_sg_distr).
func sgBucket(n int) int {
	if n <= sgMaxLin {
		return max(n, 0)
	}
	i := bits.Len(uint(n)) - 1 + sgMaxLin - sgMinLog + 1
	return min(i, SGEntriesBuckets-1)
}

// IncInflight counts a request put in flight on this path (the kernel
// does so for the min-inflight policy only; the caller decides).
func (s *ClientPathStats) IncInflight() { s.inflight.Add(1) }

// DecInflight counts a request leaving flight.
func (s *ClientPathStats) DecInflight() { s.inflight.Add(-1) }

// Inflight is the in-flight counter the min-inflight policy compares
// (int64 to match PathLoad; it is kept as the kernel's 32-bit atomic_t).
func (s *ClientPathStats) Inflight() int64 { return int64(s.inflight.Load()) }

// RecordFailover counts a request failed over from this path to another,
// on cpu.
func (s *ClientPathStats) RecordFailover(cpu int) { s.slot(cpu).failover.Add(1) }

// ReconnectSucceeded counts a successful (re)connect of the path. The
// first connect brings the count from -1 to 0.
func (s *ClientPathStats) ReconnectSucceeded() { s.reconnOK.Add(1) }

// ReconnectFailed counts a failed reconnect attempt.
func (s *ClientPathStats) ReconnectFailed() { s.reconnFail.Add(1) }

// RecordCompletion records on which CPU a completion was handled:
// expected is the CPU the connection (and the request) belongs to, cpu the
// one that processed the completion. If they differ, cpu_migration counts
// it "to" cpu and "from" expected, as the kernel's rtrs_clt_update_wc_stats.
func (s *ClientPathStats) RecordCompletion(expected, cpu int) {
	if expected == cpu {
		return
	}
	s.slot(cpu).migrTo.Add(1)
	s.slot(expected).migrFrom.Add(1)
}

// RecordPoll records one run of the completion handler on cpu that
// processed n work completions (wc_completion: max and average per run).
func (s *ClientPathStats) RecordPoll(cpu, n int) {
	c := s.slot(cpu)
	nn := uint64(max(n, 0))
	c.wcCalls.Add(1)
	c.wcTotal.Add(nn)
	statsMax(&c.wcMax, nn)
}

// RecordReadLatency records the latency of a READ request completed on
// cpu (submission to completion) in rdma_lat.
func (s *ClientPathStats) RecordReadLatency(cpu int, d time.Duration) {
	s.recordLatency(cpu, statsRead, d)
}

// RecordWriteLatency records the latency of a WRITE request.
func (s *ClientPathStats) RecordWriteLatency(cpu int, d time.Duration) {
	s.recordLatency(cpu, statsWrite, d)
}

// LatencyEnabled tells whether latencies are recorded (rdma_lat: writing
// 0 turns it off, writing 1 resets and turns it on; on by default). The
// datapath may skip taking timestamps while it is off.
func (s *ClientPathStats) LatencyEnabled() bool { return !s.latOff.Load() }

func (s *ClientPathStats) recordLatency(cpu, dir int, d time.Duration) {
	if s.latOff.Load() {
		return
	}
	ns := uint64(max(d, 0))
	c := s.slot(cpu)
	c.latMs[rdmaLatBucket(ns/uint64(time.Millisecond))][dir].Add(1)
	c.latUs[latUsBucket(ns/uint64(time.Microsecond))][dir].Add(1)
	c.latSumNs[dir].Add(ns)
	statsMax(&c.latMaxNs[dir], ns)
}

// rdmaLatBucket is the rdma_lat row of a latency of ms milliseconds
// (kernel rtrs_clt_ms_to_id: 0 for 0 ms, else ilog2(ms)+1, clamped).
func rdmaLatBucket(ms uint64) int { return min(bits.Len64(ms), RdmaLatBuckets-1) }

func latUsBucket(us uint64) int { return min(bits.Len64(us), LatUsBuckets-1) }

// ResetRdma clears the rdma counters (requests, bytes, failovers; not
// inflight), as writing 1 to rdma does.
func (s *ClientPathStats) ResetRdma() {
	for i := range s.cpus {
		c := &s.cpus[i]
		for d := range c.rdma {
			c.rdma[d].cnt.Store(0)
			c.rdma[d].bytes.Store(0)
		}
		c.failover.Store(0)
	}
}

// ResetCPUMigration clears both the from and the to counters.
func (s *ClientPathStats) ResetCPUMigration() {
	for i := range s.cpus {
		s.cpus[i].migrFrom.Store(0)
		s.cpus[i].migrTo.Store(0)
	}
}

// ResetReconnects sets both reconnect counts to 0 (the kernel memsets
// them, so the -1 of a never-connected path is not restored).
func (s *ClientPathStats) ResetReconnects() {
	s.reconnOK.Store(0)
	s.reconnFail.Store(0)
}

// ResetSGEntries clears the sg_entries distribution.
func (s *ClientPathStats) ResetSGEntries() {
	for i := range s.cpus {
		c := &s.cpus[i]
		c.sgTotal.Store(0)
		c.sgSum.Store(0)
		for j := range c.sg {
			c.sg[j].Store(0)
		}
	}
}

// ResetRdmaLat clears the latency histograms and maxima.
func (s *ClientPathStats) ResetRdmaLat() {
	for i := range s.cpus {
		c := &s.cpus[i]
		for j := range c.latMs {
			c.latMs[j][0].Store(0)
			c.latMs[j][1].Store(0)
		}
		for j := range c.latUs {
			c.latUs[j][0].Store(0)
			c.latUs[j][1].Store(0)
		}
		for d := range 2 {
			c.latSumNs[d].Store(0)
			c.latMaxNs[d].Store(0)
		}
	}
}

// ResetWcCompletion clears the wc_completion counters.
func (s *ClientPathStats) ResetWcCompletion() {
	for i := range s.cpus {
		c := &s.cpus[i]
		c.wcCalls.Store(0)
		c.wcTotal.Store(0)
		c.wcMax.Store(0)
	}
}

// ResetAll does what writing 1 to reset_all does: in 6.12 it resets rdma,
// cpu_migration, reconnects and sets inflight to 0; the 5.6 documentation
// says "all the statistics", so sg_entries, rdma_lat and wc_completion are
// reset too. Latency collection is switched (back) on.
//
// Like the kernel's, setting inflight to 0 while requests are in flight
// makes the counter go negative as they complete (6.12 then prints it as a
// large %u); it evens out when those requests are done.
func (s *ClientPathStats) ResetAll() {
	s.ResetRdma()
	s.ResetCPUMigration()
	s.ResetReconnects()
	s.ResetSGEntries()
	s.ResetRdmaLat()
	s.latOff.Store(false)
	s.ResetWcCompletion()
	s.inflight.Store(0)
}

// DirStats are the request and byte counts of one direction.
type DirStats struct {
	Count uint64 `json:"count"`
	Bytes uint64 `json:"bytes"`
}

// ReadWrite is a pair of per-direction values.
type ReadWrite struct {
	Read  uint64 `json:"read"`
	Write uint64 `json:"write"`
}

// WcStats are the wc_completion counters: the largest number of work
// completions one run of the completion handler processed, the total
// number processed and the number of runs.
type WcStats struct {
	Max   uint64 `json:"max"`
	Total uint64 `json:"total"`
	Calls uint64 `json:"calls"`
}

// Avg is Total/Calls rounded down, 0 without calls, as a u32 like the
// kernel's.
func (w WcStats) Avg() uint32 {
	if w.Calls == 0 {
		return 0
	}
	return uint32(w.Total / w.Calls)
}

// ClientStatsSnapshot is the sum over CPUs of a client path's counters (the
// per-CPU ones kept per CPU where a file prints them per CPU). Its Append
// methods render the stats files from these values.
type ClientStatsSnapshot struct {
	Read      DirStats `json:"read"`
	Write     DirStats `json:"write"`
	Inflight  int32    `json:"inflight"`
	Failovers uint64   `json:"failovers"`

	ReconnectsOK     int32 `json:"reconnects_successful"`
	ReconnectsFailed int32 `json:"reconnects_failed"`

	// MigrationFrom and MigrationTo have one entry per CPU.
	MigrationFrom []uint64 `json:"cpu_migration_from"`
	MigrationTo   []uint64 `json:"cpu_migration_to"`

	// SGDistr[cpu][row] and SGTotal[cpu]: the per-CPU sg_entries
	// distribution; SGSum is the total number of entries of all CPUs.
	SGDistr [][SGEntriesBuckets]uint64 `json:"sg_entries"`
	SGTotal []uint64                   `json:"sg_total"`
	SGSum   uint64                     `json:"sg_sum"`

	// LatMs are the rdma_lat rows, LatUs the fine µs histogram, LatSumNs
	// the sum of all latencies and LatMaxNs the largest one, in ns.
	LatEnabled bool                      `json:"latency_enabled"`
	LatMs      [RdmaLatBuckets]ReadWrite `json:"rdma_lat_ms"`
	LatUs      [LatUsBuckets]ReadWrite   `json:"rdma_lat_us"`
	LatSumNs   ReadWrite                 `json:"latency_sum_ns"`
	LatMaxNs   ReadWrite                 `json:"latency_max_ns"`

	Wc WcStats `json:"wc_completion"`
}

// Snapshot sums the per-CPU counters.
func (s *ClientPathStats) Snapshot() *ClientStatsSnapshot {
	n := len(s.cpus)
	r := &ClientStatsSnapshot{
		Inflight:         s.inflight.Load(),
		ReconnectsOK:     s.reconnOK.Load(),
		ReconnectsFailed: s.reconnFail.Load(),
		MigrationFrom:    make([]uint64, n),
		MigrationTo:      make([]uint64, n),
		SGDistr:          make([][SGEntriesBuckets]uint64, n),
		SGTotal:          make([]uint64, n),
		LatEnabled:       !s.latOff.Load(),
	}
	for i := range s.cpus {
		c := &s.cpus[i]
		r.Read.Count += c.rdma[statsRead].cnt.Load()
		r.Read.Bytes += c.rdma[statsRead].bytes.Load()
		r.Write.Count += c.rdma[statsWrite].cnt.Load()
		r.Write.Bytes += c.rdma[statsWrite].bytes.Load()
		r.Failovers += c.failover.Load()
		r.MigrationFrom[i] = c.migrFrom.Load()
		r.MigrationTo[i] = c.migrTo.Load()
		for j := range c.sg {
			r.SGDistr[i][j] = c.sg[j].Load()
		}
		r.SGTotal[i] = c.sgTotal.Load()
		r.SGSum += c.sgSum.Load()
		for j := range c.latMs {
			r.LatMs[j].Read += c.latMs[j][statsRead].Load()
			r.LatMs[j].Write += c.latMs[j][statsWrite].Load()
		}
		for j := range c.latUs {
			r.LatUs[j].Read += c.latUs[j][statsRead].Load()
			r.LatUs[j].Write += c.latUs[j][statsWrite].Load()
		}
		r.LatSumNs.Read += c.latSumNs[statsRead].Load()
		r.LatSumNs.Write += c.latSumNs[statsWrite].Load()
		r.LatMaxNs.Read = max(r.LatMaxNs.Read, c.latMaxNs[statsRead].Load())
		r.LatMaxNs.Write = max(r.LatMaxNs.Write, c.latMaxNs[statsWrite].Load())
		r.Wc.Calls += c.wcCalls.Load()
		r.Wc.Total += c.wcTotal.Load()
		r.Wc.Max = max(r.Wc.Max, c.wcMax.Load())
	}
	return r
}

// ServerPathStats are the statistics of one server path. Create them with
// NewServerPathStats; all methods are safe for concurrent use.
type ServerPathStats struct {
	cpus     []serverCPUSlot
	_        [statsCacheLine]byte
	inflight atomic.Int32
}

// NewServerPathStats returns zeroed statistics with ncpu per-CPU slots
// (ncpu <= 0 means StatsPossibleCPUs()).
func NewServerPathStats(ncpu int) *ServerPathStats {
	if ncpu <= 0 {
		ncpu = StatsPossibleCPUs()
	}
	return &ServerPathStats{cpus: make([]serverCPUSlot, ncpu)}
}

// NumCPU is the number of per-CPU slots.
func (s *ServerPathStats) NumCPU() int { return len(s.cpus) }

func (s *ServerPathStats) slot(cpu int) *serverCPU {
	return &s.cpus[statsCPU(cpu, len(s.cpus))].serverCPU
}

// RecordRead counts a READ request processed on cpu; bytes is the data
// length plus the user message length, as the kernel server counts it.
func (s *ServerPathStats) RecordRead(cpu int, bytes uint64) {
	d := &s.slot(cpu).rdma[statsRead]
	d.cnt.Add(1)
	d.bytes.Add(bytes)
}

// RecordWrite counts a WRITE request processed on cpu; bytes is data +
// user message.
func (s *ServerPathStats) RecordWrite(cpu int, bytes uint64) {
	d := &s.slot(cpu).rdma[statsWrite]
	d.cnt.Add(1)
	d.bytes.Add(bytes)
}

// RecordPoll records one run of the completion handler on cpu that
// processed n work completions.
func (s *ServerPathStats) RecordPoll(cpu, n int) {
	c := s.slot(cpu)
	nn := uint64(max(n, 0))
	c.wcCalls.Add(1)
	c.wcTotal.Add(nn)
	statsMax(&c.wcMax, nn)
}

// IncInflight counts a request taken into processing (the 5.6 server's
// ids_inflight; 6.12 no longer prints it).
func (s *ServerPathStats) IncInflight() { s.inflight.Add(1) }

// DecInflight counts a request answered.
func (s *ServerPathStats) DecInflight() { s.inflight.Add(-1) }

// Inflight is the number of requests being processed.
func (s *ServerPathStats) Inflight() int64 { return int64(s.inflight.Load()) }

// ResetRdma clears the rdma counters, as writing 1 to rdma does.
func (s *ServerPathStats) ResetRdma() {
	for i := range s.cpus {
		c := &s.cpus[i]
		for d := range c.rdma {
			c.rdma[d].cnt.Store(0)
			c.rdma[d].bytes.Store(0)
		}
	}
}

// ResetWcCompletion clears the wc_completion counters.
func (s *ServerPathStats) ResetWcCompletion() {
	for i := range s.cpus {
		c := &s.cpus[i]
		c.wcCalls.Store(0)
		c.wcTotal.Store(0)
		c.wcMax.Store(0)
	}
}

// ResetAll resets rdma and wc_completion, as the 5.6 server's reset_all
// (which never touched ids_inflight).
func (s *ServerPathStats) ResetAll() {
	s.ResetRdma()
	s.ResetWcCompletion()
}

// ServerStatsSnapshot is the sum over CPUs of a server path's counters.
type ServerStatsSnapshot struct {
	Read     DirStats `json:"read"`
	Write    DirStats `json:"write"`
	Inflight int32    `json:"inflight"`
	Wc       WcStats  `json:"wc_completion"`
}

// Snapshot sums the per-CPU counters.
func (s *ServerPathStats) Snapshot() *ServerStatsSnapshot {
	r := &ServerStatsSnapshot{Inflight: s.inflight.Load()}
	for i := range s.cpus {
		c := &s.cpus[i]
		r.Read.Count += c.rdma[statsRead].cnt.Load()
		r.Read.Bytes += c.rdma[statsRead].bytes.Load()
		r.Write.Count += c.rdma[statsWrite].cnt.Load()
		r.Write.Bytes += c.rdma[statsWrite].bytes.Load()
		r.Wc.Calls += c.wcCalls.Load()
		r.Wc.Total += c.wcTotal.Load()
		r.Wc.Max = max(r.Wc.Max, c.wcMax.Load())
	}
	return r
}
