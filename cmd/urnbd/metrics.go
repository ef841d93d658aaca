package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/urnbd/urnbd/bpf"
	"github.com/urnbd/urnbd/rtrs"
)

// serveMetrics serves the daemon's statistics in the Prometheus text
// format on http://addr/metrics: the RTRS client families of every path
// (see package rtrs) and, from eBPF, each device's block latency.
func (d *clientDaemon) serveMetrics(addr string) error {
	return serveMetricsOn(addr, "urnbd client daemon", func() ([]byte, error) {
		rep, err := d.collectStats(false)
		if err != nil {
			return nil, err
		}
		return rep.appendPrometheus(nil), nil
	})
}

// serveMetricsOn serves what render gives on http://addr/metrics, in the
// Prometheus text format; who names the process in its logs.
func serveMetricsOn(addr, who string, render func() ([]byte, error)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		b, err := render()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(b)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Printf("%s: metrics: %v", who, err)
		}
	}()
	log.Printf("%s: metrics on http://%s/metrics", who, ln.Addr())
	return nil
}

// appendPrometheus renders the report in the Prometheus text format.
func (r *statsReport) appendPrometheus(b []byte) []byte {
	var paths []rtrs.PromClientPath
	for _, s := range r.Sessions {
		for _, p := range s.Paths {
			paths = append(paths, rtrs.PromClientPath{Sess: s.Name, Path: p.Addr, Stats: p.Stats})
		}
	}
	b = rtrs.AppendClientPrometheus(b, paths)

	const lat = "urnbd_block_latency_seconds"
	b = rtrs.AppendPromHeader(b, lat, "histogram", "Block request latency of a mapped device, issue to completion (eBPF).")
	for _, d := range r.Devices {
		if d.Latency == nil {
			continue
		}
		for dir, name := range [bpf.NumDirs]string{"read", "write", "other"} {
			labels := "device=" + strconv.Quote(d.Device) + ",sess=" + strconv.Quote(d.SessName) + ",dir=" + strconv.Quote(name)
			b = rtrs.AppendPromLatency(b, lat, labels, d.Latency.Us[dir][:], d.Latency.SumNs[dir])
		}
	}
	const up = "urnbd_ebpf_up"
	b = rtrs.AppendPromHeader(b, up, "gauge", "1 when the eBPF program runs, 0 when it is unavailable (see urnbd stats).")
	for _, p := range [...]struct{ name, state string }{{"block_latency", r.EBPF.BlockLatency}, {"completion_cpu", r.EBPF.CompletionCPU}} {
		v := 0
		if p.state == "on" {
			v = 1
		}
		b = fmt.Appendf(b, "%s{program=%q} %d\n", up, p.name, v)
	}
	return b
}
