package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/bpf"
	"github.com/urnbd/urnbd/rtrs"
)

func traceCommand() *cli.Command {
	return &cli.Command{
		Name:  "trace",
		Usage: "live view of each mapped device's latency histogram and each path's rates and CPU migrations",
		Description: "Every --interval, shows what happened in that interval: per device, requests per second and the\n" +
			"block latency histogram in µs (eBPF, issue to completion); per path, requests per second, in-flight\n" +
			"requests, heartbeat RTT and the cpu_migration from/to counts (eBPF). On a terminal the screen is\n" +
			"redrawn; otherwise frames follow each other. Needs a running client daemon (a mapped device).",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "refresh every `DURATION`"},
			&cli.IntFlag{Name: "count", Usage: "stop after `N` frames (0: until interrupted)"},
		},
		Action: func(c *cli.Context) error {
			interval := c.Duration("interval")
			if interval < 10*time.Millisecond {
				return fmt.Errorf("trace: --interval %v: at least 10ms: %w", interval, unix.EINVAL)
			}
			prev, err := fetchStats(false)
			if err != nil {
				return fmt.Errorf("trace: %w", err)
			}
			tty := isTerminal(os.Stdout)
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
			defer signal.Stop(sigs)
			tick := time.NewTicker(interval)
			defer tick.Stop()
			last := time.Now()
			for n := 0; c.Int("count") == 0 || n < c.Int("count"); n++ {
				select {
				case <-sigs:
					return nil
				case <-tick.C:
				}
				cur, err := fetchStats(false)
				if err != nil {
					return fmt.Errorf("trace: %w", err)
				}
				now := time.Now()
				var b []byte
				if tty {
					b = append(b, "\x1b[H\x1b[2J"...)
				}
				b = appendTraceFrame(b, prev, cur, now, now.Sub(last))
				os.Stdout.Write(b)
				prev, last = cur, now
			}
			return nil
		},
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// appendTraceFrame renders what changed from prev to cur over dt.
func appendTraceFrame(b []byte, prev, cur *statsReport, now time.Time, dt time.Duration) []byte {
	secs := dt.Seconds()
	rate := func(n uint64) float64 { return float64(n) / secs }
	b = fmt.Appendf(b, "urnbd trace %s, last %.1fs\n", now.Format("15:04:05"), secs)
	for _, d := range cur.Devices {
		b = fmt.Appendf(b, "\n%s (session %s, %s)\n", d.Device, d.SessName, d.MapPath)
		if d.Latency == nil {
			b = fmt.Appendf(b, "  latency: eBPF unavailable: %s\n", d.LatencyOff)
			continue
		}
		var before bpf.Histogram
		for _, p := range prev.Devices {
			if p.Device == d.Device && p.Latency != nil {
				before = *p.Latency
			}
		}
		h := histDelta(d.Latency, &before)
		b = fmt.Appendf(b, "  IOPS read %.0f write %.0f other %.0f", rate(h.Count[bpf.Read]), rate(h.Count[bpf.Write]), rate(h.Count[bpf.Other]))
		for dir, name := range [2]string{"read", "write"} {
			if h.Count[dir] > 0 {
				b = fmt.Appendf(b, "; avg %s %.0f µs", name, float64(h.SumNs[dir])/float64(h.Count[dir])/1e3)
			}
		}
		b = append(b, '\n')
		b = appendUsBars(b, h)
	}
	for _, s := range cur.Sessions {
		for _, p := range s.Paths {
			var before rtrs.ClientStatsSnapshot
			for _, ps := range prev.Sessions {
				for _, pp := range ps.Paths {
					if ps.Name == s.Name && pp.Index == p.Index && pp.Stats != nil {
						before = *pp.Stats
					}
				}
			}
			st := p.Stats
			b = fmt.Appendf(b, "\nsession %s path %d %s (%s): read %.0f/s write %.0f/s, inflight %d, cur_latency %d µs, failovers %d\n",
				s.Name, p.Index, p.Addr, p.State, rate(st.Read.Count-before.Read.Count), rate(st.Write.Count-before.Write.Count),
				st.Inflight, p.CurLatencyNs/1e3, st.Failovers-before.Failovers)
			if p.CPUMigration != "ebpf" {
				b = fmt.Appendf(b, "  cpu_migration: %s\n", p.CPUMigration)
				continue
			}
			delta := rtrs.ClientStatsSnapshot{MigrationFrom: sliceDelta(st.MigrationFrom, before.MigrationFrom), MigrationTo: sliceDelta(st.MigrationTo, before.MigrationTo)}
			b = append(b, "  cpu_migration (this interval):\n"...)
			for _, l := range strings.SplitAfter(strings.TrimRight(string(delta.AppendCPUMigration(nil)), "\n"), "\n") {
				b = fmt.Appendf(b, "    %s", l)
			}
			b = append(b, '\n')
		}
	}
	return b
}

func sliceDelta(cur, prev []uint64) []uint64 {
	out := make([]uint64, len(cur))
	for i := range cur {
		out[i] = cur[i]
		if i < len(prev) && prev[i] <= cur[i] {
			out[i] -= prev[i]
		}
	}
	return out
}

// histDelta returns cur - prev (cur itself where a count went down: the
// maps were reset in between).
func histDelta(cur, prev *bpf.Histogram) *bpf.Histogram {
	d := *cur
	for dir := range bpf.NumDirs {
		if cur.Count[dir] < prev.Count[dir] {
			continue
		}
		d.Count[dir] -= prev.Count[dir]
		d.SumNs[dir] -= prev.SumNs[dir]
		for k := range d.Us[dir] {
			d.Us[dir][k] -= prev.Us[dir][k]
		}
		for k := range d.Ms[dir] {
			d.Ms[dir][k] -= prev.Ms[dir][k]
		}
	}
	return &d
}

// appendUsBars draws the read and write µs histograms side by side, one
// row per non-empty bucket, as bcc's biolatency does.
func appendUsBars(b []byte, h *bpf.Histogram) []byte {
	const width = 30
	var top uint64
	first, last := -1, -1
	for k := range bpf.LatUsBuckets {
		n := max(h.Us[bpf.Read][k], h.Us[bpf.Write][k])
		if n > 0 {
			if first < 0 {
				first = k
			}
			last = k
			top = max(top, n)
		}
	}
	if first < 0 {
		return append(b, "  (no requests)\n"...)
	}
	b = fmt.Appendf(b, "  %21s  %8s %-*s  %8s %s\n", "µs", "reads", width, "", "writes", "")
	for k := first; k <= last; k++ {
		lo, hi := uint64(0), uint64(1)<<k
		if k > 0 {
			lo = uint64(1) << (k - 1)
		}
		label := fmt.Sprintf("%d -> %d", lo, hi-1)
		if k == bpf.LatUsBuckets-1 {
			label = fmt.Sprintf(">= %d", lo)
		}
		r, w := h.Us[bpf.Read][k], h.Us[bpf.Write][k]
		b = fmt.Appendf(b, "  %21s  %8d %-*s  %8d %s\n", label, r, width, strings.Repeat("*", int(r*width/top)), w, strings.Repeat("*", int(w*width/top)))
	}
	return b
}
