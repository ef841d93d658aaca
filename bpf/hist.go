//go:build linux

package bpf

import (
	"io"

	"github.com/urnbd/urnbd/rtrs"
)

// Dir is the direction of a block request.
type Dir uint32

// The directions, as the programs number them (enum blk_dir).
const (
	Read  Dir = 0
	Write Dir = 1
	// Other is every operation that is neither a read nor a write: flush,
	// discard, write zeroes, driver-private requests.
	Other Dir = 2
	// NumDirs is the number of directions.
	NumDirs = 3
)

// The histogram sizes, those of the RTRS statistics.
const (
	// LatUsBuckets is the number of µs buckets: bucket k < LatUsBuckets-1
	// counts latencies below 2^k µs and at least 2^(k-1) µs, the last
	// one everything longer.
	LatUsBuckets = 28
	// RdmaLatBuckets is the number of ms buckets, the rows of rdma_lat:
	// bucket k < RdmaLatBuckets-1 counts latencies below 2^k ms, the
	// last one ">= 65536 ms".
	RdmaLatBuckets = 18
)

// The bucket counts must be rtrs's, whose formatters print them (and
// BLK_US_BUCKETS, BLK_MS_BUCKETS of block_lat.h): a difference does not
// compile.
const (
	_ = uint(LatUsBuckets-rtrs.LatUsBuckets) + uint(rtrs.LatUsBuckets-LatUsBuckets)
	_ = uint(RdmaLatBuckets-rtrs.RdmaLatBuckets) + uint(rtrs.RdmaLatBuckets-RdmaLatBuckets)
)

// Histogram is the latency distribution of one device, per direction,
// from issue to completion of its block requests.
type Histogram struct {
	Us    [NumDirs][LatUsBuckets]uint64   `json:"us"`
	Ms    [NumDirs][RdmaLatBuckets]uint64 `json:"ms"`
	Count [NumDirs]uint64                 `json:"count"`
	SumNs [NumDirs]uint64                 `json:"sum_ns"`
	MaxNs [NumDirs]uint64                 `json:"max_ns"`
}

// snapshot puts the read and write columns where rtrs's formatters read
// them.
func (h *Histogram) snapshot() *rtrs.ClientStatsSnapshot {
	s := &rtrs.ClientStatsSnapshot{LatEnabled: true}
	for i := range RdmaLatBuckets {
		s.LatMs[i] = rtrs.ReadWrite{Read: h.Ms[Read][i], Write: h.Ms[Write][i]}
	}
	for i := range LatUsBuckets {
		s.LatUs[i] = rtrs.ReadWrite{Read: h.Us[Read][i], Write: h.Us[Write][i]}
	}
	s.LatSumNs = rtrs.ReadWrite{Read: h.SumNs[Read], Write: h.SumNs[Write]}
	s.LatMaxNs = rtrs.ReadWrite{Read: h.MaxNs[Read], Write: h.MaxNs[Write]}
	return s
}

// AppendRdmaLat renders the histogram as RTRS's rdma_lat file: a row per
// ms bucket ("<      1 ms: READS WRITES" ... ">= 65536 ms: ..."), then
// "maximum ms: ...". Other operations are not in it.
func (h *Histogram) AppendRdmaLat(b []byte) []byte { return h.snapshot().AppendRdmaLat(b) }

// AppendLatUs renders the µs histogram in the same layout ("<         1
// us: READS WRITES" ... "maximum us: ...").
func (h *Histogram) AppendLatUs(b []byte) []byte { return h.snapshot().AppendRdmaLatUs(b) }

// FormatRdmaLat writes AppendRdmaLat's text to w.
func (h *Histogram) FormatRdmaLat(w io.Writer) error {
	_, err := w.Write(h.AppendRdmaLat(nil))
	return err
}

// FormatLatUs writes AppendLatUs's text to w.
func (h *Histogram) FormatLatUs(w io.Writer) error {
	_, err := w.Write(h.AppendLatUs(nil))
	return err
}

// Total returns the number of requests of direction d in the histogram.
func (h *Histogram) Total(d Dir) uint64 { return sum(h.Us[d][:]) }
