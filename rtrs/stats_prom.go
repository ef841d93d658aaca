package rtrs

import (
	"strconv"
	"strings"
)

// Prometheus text exposition (format 0.0.4) of path statistics, for the
// /metrics endpoint. All samples carry the labels sess and path (the
// <src@dst> directory name); per-CPU counters add cpu, latencies dir.
// Metric families are rendered one after the other across all the paths
// given, each with one HELP and one TYPE line, as the format requires.
//
// Client families (prefix urnbd_rtrs_client_):
//
//	read_requests_total, read_bytes_total, write_requests_total,
//	write_bytes_total                        counters (rdma)
//	inflight                                 gauge (rdma)
//	failovers_total                          counter (rdma)
//	reconnects{result="successful"|"failed"} gauge (reconnects; starts at -1)
//	cpu_migration_from_total{cpu}, cpu_migration_to_total{cpu} counters
//	sg_entries                               histogram, le = 0,1,2,3,4,7,15,31
//	request_latency_seconds{dir}             histogram, le = 2^k µs, k = 0..26
//	request_latency_max_seconds{dir}         gauge
//	wc_completion_max                        gauge
//	work_completions_total, completion_polls_total counters
//
// Server families (prefix urnbd_rtrs_server_): read_requests_total,
// read_bytes_total, write_requests_total, write_bytes_total, inflight,
// wc_completion_max, work_completions_total, completion_polls_total.
//
// Counters are reset by Reset/ResetAll; Prometheus treats a decrease as a
// counter reset.

// PromClientPath is one client path to render.
type PromClientPath struct {
	Sess, Path string
	Stats      *ClientStatsSnapshot
}

// PromServerPath is one server path to render.
type PromServerPath struct {
	Sess, Path string
	Stats      *ServerStatsSnapshot
}

var promLabelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// promLabels returns `sess="..",path=".."` escaped.
func promLabels(sess, path string) string {
	return `sess="` + promLabelEscaper.Replace(sess) + `",path="` + promLabelEscaper.Replace(path) + `"`
}

// PromLabelValue quotes s as a Prometheus label value: in double quotes,
// with backslash, double quote and newline escaped.
func PromLabelValue(s string) string { return `"` + promLabelEscaper.Replace(s) + `"` }

// AppendPromHeader appends the HELP and TYPE lines of a metric family.
func AppendPromHeader(b []byte, name, typ, help string) []byte { return promHeader(b, name, typ, help) }

// AppendPromLatency appends the samples of one latency histogram in
// seconds (name_bucket, name_sum, name_count; labels without braces) from
// log2 µs buckets as the rdma_lat_us rows count them: bucket k < len-1
// holds latencies below 2^k µs, the last one the rest.
func AppendPromLatency(b []byte, name, labels string, us []uint64, sumNs uint64) []byte {
	var cum uint64
	for k, v := range us {
		cum += v
		le := `le="+Inf"`
		if k < len(us)-1 {
			le = `le="` + strconv.FormatFloat(float64(uint64(1)<<k)/1e6, 'g', -1, 64) + `"`
		}
		b = promSample(b, name+"_bucket", labels, le, cum)
	}
	b = promSampleFloat(b, name+"_sum", labels, "", float64(sumNs)/1e9)
	return promSample(b, name+"_count", labels, "", cum)
}

func promHeader(b []byte, name, typ, help string) []byte {
	b = append(b, "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, help...)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, typ...)
	return append(b, '\n')
}

// promSample appends `name{labels,extra} value\n`; extra may be empty.
func promSample(b []byte, name, labels, extra string, v uint64) []byte {
	b = promName(b, name, labels, extra)
	b = strconv.AppendUint(b, v, 10)
	return append(b, '\n')
}

func promSampleInt(b []byte, name, labels, extra string, v int64) []byte {
	b = promName(b, name, labels, extra)
	b = strconv.AppendInt(b, v, 10)
	return append(b, '\n')
}

func promSampleFloat(b []byte, name, labels, extra string, v float64) []byte {
	b = promName(b, name, labels, extra)
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	return append(b, '\n')
}

func promName(b []byte, name, labels, extra string) []byte {
	b = append(b, name...)
	b = append(b, '{')
	b = append(b, labels...)
	if extra != "" && labels != "" {
		b = append(b, ',')
	}
	if extra != "" {
		b = append(b, extra...)
	}
	return append(b, "} "...)
}

type promFamily[T any] struct {
	name, typ, help string
	emit            func(b []byte, name, labels string, s T) []byte
}

func promCounter[T any](name, help string, v func(T) uint64) promFamily[T] {
	return promFamily[T]{name, "counter", help, func(b []byte, n, l string, s T) []byte {
		return promSample(b, n, l, "", v(s))
	}}
}

func promGauge[T any](name, help string, v func(T) int64) promFamily[T] {
	return promFamily[T]{name, "gauge", help, func(b []byte, n, l string, s T) []byte {
		return promSampleInt(b, n, l, "", v(s))
	}}
}

const (
	promClientPrefix = "urnbd_rtrs_client_"
	promServerPrefix = "urnbd_rtrs_server_"
)

// sgBucketLe is the largest entry count of sg_entries row i (le label).
var sgBucketLe = [SGEntriesBuckets - 1]string{"0", "1", "2", "3", "4", "7", "15", "31"}

var promClientFamilies = []promFamily[*ClientStatsSnapshot]{
	promCounter("read_requests_total", "READ requests sent on the path.",
		func(s *ClientStatsSnapshot) uint64 { return s.Read.Count }),
	promCounter("read_bytes_total", "Bytes (user message + data) of READ requests.",
		func(s *ClientStatsSnapshot) uint64 { return s.Read.Bytes }),
	promCounter("write_requests_total", "WRITE requests sent on the path.",
		func(s *ClientStatsSnapshot) uint64 { return s.Write.Count }),
	promCounter("write_bytes_total", "Bytes (user message + data) of WRITE requests.",
		func(s *ClientStatsSnapshot) uint64 { return s.Write.Bytes }),
	promGauge("inflight", "Requests in flight on the path (min-inflight counter).",
		func(s *ClientStatsSnapshot) int64 { return int64(s.Inflight) }),
	promCounter("failovers_total", "Requests failed over from this path.",
		func(s *ClientStatsSnapshot) uint64 { return s.Failovers }),
	{"reconnects", "gauge", "Reconnects of the path by result (successful starts at -1).",
		func(b []byte, n, l string, s *ClientStatsSnapshot) []byte {
			b = promSampleInt(b, n, l, `result="successful"`, int64(s.ReconnectsOK))
			return promSampleInt(b, n, l, `result="failed"`, int64(s.ReconnectsFailed))
		}},
	{"cpu_migration_from_total", "counter", "Completions expected on this CPU but handled on another.",
		func(b []byte, n, l string, s *ClientStatsSnapshot) []byte {
			for cpu, v := range s.MigrationFrom {
				b = promSample(b, n, l, `cpu="`+strconv.Itoa(cpu)+`"`, v)
			}
			return b
		}},
	{"cpu_migration_to_total", "counter", "Completions handled on this CPU though expected on another.",
		func(b []byte, n, l string, s *ClientStatsSnapshot) []byte {
			for cpu, v := range s.MigrationTo {
				b = promSample(b, n, l, `cpu="`+strconv.Itoa(cpu)+`"`, v)
			}
			return b
		}},
	{"sg_entries", "histogram", "Scatter-gather entries per request.",
		func(b []byte, n, l string, s *ClientStatsSnapshot) []byte {
			var rows [SGEntriesBuckets]uint64
			var count uint64
			for cpu := range s.SGDistr {
				for i, v := range s.SGDistr[cpu] {
					rows[i] += v
				}
				count += s.SGTotal[cpu]
			}
			var cum uint64
			for i, le := range sgBucketLe {
				cum += rows[i]
				b = promSample(b, n+"_bucket", l, `le="`+le+`"`, cum)
			}
			b = promSample(b, n+"_bucket", l, `le="+Inf"`, count)
			b = promSample(b, n+"_sum", l, "", s.SGSum)
			return promSample(b, n+"_count", l, "", count)
		}},
	{"request_latency_seconds", "histogram", "Request latency from submission to completion.",
		func(b []byte, n, l string, s *ClientStatsSnapshot) []byte {
			var us [LatUsBuckets]uint64
			for dir, d := range [2]string{`dir="read"`, `dir="write"`} {
				for k := range us {
					us[k] = promRW(s.LatUs[k], dir)
				}
				b = AppendPromLatency(b, n, l+","+d, us[:], promRW(s.LatSumNs, dir))
			}
			return b
		}},
	{"request_latency_max_seconds", "gauge", "Largest request latency since the last reset.",
		func(b []byte, n, l string, s *ClientStatsSnapshot) []byte {
			b = promSampleFloat(b, n, l, `dir="read"`, float64(s.LatMaxNs.Read)/1e9)
			return promSampleFloat(b, n, l, `dir="write"`, float64(s.LatMaxNs.Write)/1e9)
		}},
	promGauge("wc_completion_max", "Most work completions processed by one completion handler run.",
		func(s *ClientStatsSnapshot) int64 { return int64(s.Wc.Max) }),
	promCounter("work_completions_total", "Work completions processed.",
		func(s *ClientStatsSnapshot) uint64 { return s.Wc.Total }),
	promCounter("completion_polls_total", "Runs of the completion handler.",
		func(s *ClientStatsSnapshot) uint64 { return s.Wc.Calls }),
}

func promRW(v ReadWrite, dir int) uint64 {
	if dir == statsWrite {
		return v.Write
	}
	return v.Read
}

var promServerFamilies = []promFamily[*ServerStatsSnapshot]{
	promCounter("read_requests_total", "READ requests served on the path.",
		func(s *ServerStatsSnapshot) uint64 { return s.Read.Count }),
	promCounter("read_bytes_total", "Bytes (data + user message) of READ requests.",
		func(s *ServerStatsSnapshot) uint64 { return s.Read.Bytes }),
	promCounter("write_requests_total", "WRITE requests served on the path.",
		func(s *ServerStatsSnapshot) uint64 { return s.Write.Count }),
	promCounter("write_bytes_total", "Bytes (data + user message) of WRITE requests.",
		func(s *ServerStatsSnapshot) uint64 { return s.Write.Bytes }),
	promGauge("inflight", "Requests being processed on the path.",
		func(s *ServerStatsSnapshot) int64 { return int64(s.Inflight) }),
	promGauge("wc_completion_max", "Most work completions processed by one completion handler run.",
		func(s *ServerStatsSnapshot) int64 { return int64(s.Wc.Max) }),
	promCounter("work_completions_total", "Work completions processed.",
		func(s *ServerStatsSnapshot) uint64 { return s.Wc.Total }),
	promCounter("completion_polls_total", "Runs of the completion handler.",
		func(s *ServerStatsSnapshot) uint64 { return s.Wc.Calls }),
}

func appendPromFamilies[T any](b []byte, prefix string, fams []promFamily[T], labels []string, snaps []T) []byte {
	for _, f := range fams {
		name := prefix + f.name
		b = promHeader(b, name, f.typ, f.help)
		for i, s := range snaps {
			b = f.emit(b, name, labels[i], s)
		}
	}
	return b
}

// AppendClientPrometheus appends the metrics of the given client paths in
// the Prometheus text format (HELP and TYPE lines included). Nil Stats
// are skipped.
func AppendClientPrometheus(b []byte, paths []PromClientPath) []byte {
	labels := make([]string, 0, len(paths))
	snaps := make([]*ClientStatsSnapshot, 0, len(paths))
	for _, p := range paths {
		if p.Stats != nil {
			labels = append(labels, promLabels(p.Sess, p.Path))
			snaps = append(snaps, p.Stats)
		}
	}
	return appendPromFamilies(b, promClientPrefix, promClientFamilies, labels, snaps)
}

// AppendServerPrometheus appends the metrics of the given server paths.
func AppendServerPrometheus(b []byte, paths []PromServerPath) []byte {
	labels := make([]string, 0, len(paths))
	snaps := make([]*ServerStatsSnapshot, 0, len(paths))
	for _, p := range paths {
		if p.Stats != nil {
			labels = append(labels, promLabels(p.Sess, p.Path))
			snaps = append(snaps, p.Stats)
		}
	}
	return appendPromFamilies(b, promServerPrefix, promServerFamilies, labels, snaps)
}

// AppendPrometheus appends the metrics of this one path (a convenience
// for AppendClientPrometheus; with several paths use that, so that each
// metric family appears once).
func (s *ClientPathStats) AppendPrometheus(b []byte, sess, path string) []byte {
	return AppendClientPrometheus(b, []PromClientPath{{sess, path, s.Snapshot()}})
}

// AppendPrometheus appends the metrics of this one server path.
func (s *ServerPathStats) AppendPrometheus(b []byte, sess, path string) []byte {
	return AppendServerPrometheus(b, []PromServerPath{{sess, path, s.Snapshot()}})
}
