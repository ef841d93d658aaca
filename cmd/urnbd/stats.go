package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urnbd/urnbd/internal/clientd"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/bpf"
	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/ublk"
)

// statsReport is what the client daemon measured: per session and path
// the RTRS statistics (urnbd's own per-CPU counters, with cpu_migration
// from eBPF where it can be measured), per mapped device the block
// latency seen by eBPF, and the RDMA devices' completion interrupts. It
// is the JSON of `urnbd stats --json`.
type statsReport struct {
	Sessions []sessionReport   `json:"sessions"`
	Devices  []deviceReport    `json:"devices"`
	IRQs     []rdma.DeviceIRQs `json:"rdma_irqs"`
	EBPF     ebpfReport        `json:"ebpf"`
}

// ebpfReport says which eBPF programs run: "on", or why not.
type ebpfReport struct {
	BlockLatency  string `json:"block_latency"`
	CompletionCPU string `json:"completion_cpu"`
}

type sessionReport struct {
	Name      string       `json:"sessname"`
	Transport string       `json:"transport"`
	Paths     []pathReport `json:"paths"`
}

type pathReport struct {
	Index int    `json:"index"`
	Addr  string `json:"addr"`
	State string `json:"state"`
	// LastError is why the path's last connect attempt failed.
	LastError string `json:"last_error,omitempty"`
	// CurLatencyNs is the last heartbeat round trip (cur_latency).
	CurLatencyNs int64                     `json:"cur_latency_ns"`
	Stats        *rtrs.ClientStatsSnapshot `json:"stats"`
	// CPUMigration says where Stats' cpu_migration counts come from:
	// "ebpf", or why they were not measured.
	CPUMigration string `json:"cpu_migration_source"`
	// Queues are, with eBPF, the completion events of each queue's CQ on
	// this path, per CPU they were raised on.
	Queues []queueEvents `json:"queues,omitempty"`
}

// queueEvents are the completion events of one queue's CQ of a path: the
// queue is polled on CPU; PerCPU[c] events were raised on CPU c.
type queueEvents struct {
	Queue int `json:"queue"`
	CPU   int `json:"cpu"`
	TID   int `json:"tid"` // the polling thread

	PerCPU []uint64 `json:"events_per_cpu"`
}

type deviceReport struct {
	Device    string `json:"devname"`
	SessName  string `json:"sessname"`
	MapPath   string `json:"mapping_path"`
	Transport string `json:"transport"`
	// Latency is the block request latency, issue to completion, from
	// eBPF; LatencyOff says why it is missing.
	Latency    *bpf.Histogram `json:"block_latency,omitempty"`
	LatencyOff string         `json:"block_latency_unavailable,omitempty"`
}

// onOrWhy renders a program's state for ebpfReport.
func onOrWhy(err error) string {
	if err != nil {
		return err.Error()
	}
	return "on"
}

// collectStats gathers the daemon's statistics; reset clears them after
// reading (as the kernel's reset_all, and the eBPF maps too).
func (d *clientDaemon) collectStats(reset bool) (*statsReport, error) {
	sessions, devices := d.reg.Sessions(), d.reg.Devices()
	rep := &statsReport{Sessions: []sessionReport{}, Devices: []deviceReport{}, IRQs: []rdma.DeviceIRQs{}}
	blk, blkErr := d.obs.blockLatency()
	rep.EBPF.BlockLatency = onOrWhy(blkErr)
	var cqCounts []bpf.CQCount
	compErr := errors.New("no RDMA session")
	for _, s := range sessions {
		if s.Spec.Transport == "rdma" {
			var comp *bpf.CompletionCPU
			if comp, compErr = d.obs.completionCPU(); compErr == nil {
				cqCounts, compErr = comp.CQs()
			}
			break
		}
	}
	rep.EBPF.CompletionCPU = onOrWhy(compErr)

	for _, sess := range sessions {
		sr := sessionReport{Name: sess.Spec.SessName, Transport: sess.Spec.Transport}
		cqs := sess.Client.CompletionQueues()
		for _, p := range sess.Client.Paths() {
			pr := pathReport{Index: p.Index, Addr: p.Addr, State: p.State, LastError: p.LastError, CurLatencyNs: p.RTT.Nanoseconds(), Stats: p.Stats.Snapshot()}
			switch {
			case sess.Spec.Transport != "rdma":
				pr.CPUMigration = "not measured over TCP: its queues are woken by sockets, not by RDMA completion handlers"
			case compErr != nil:
				pr.CPUMigration = "eBPF completion CPU program unavailable: " + compErr.Error()
			default:
				expected := map[uint64]int{}
				for _, cq := range cqs {
					if cq.Path == p.Index && cq.CPU >= 0 {
						expected[cq.UserHandle] = cq.CPU
						pr.Queues = append(pr.Queues, queueEvents{Queue: cq.Queue, CPU: cq.CPU, TID: cq.TID,
							PerCPU: eventsOf(cqCounts, cq.UserHandle, p.Stats.NumCPU())})
					}
				}
				if len(expected) == 0 {
					pr.CPUMigration = "no completion queue of this path is polled by a pinned queue thread (path not connected, or queues not pinned)"
					break
				}
				pr.CPUMigration = "ebpf"
				pr.Stats.MigrationFrom, pr.Stats.MigrationTo = bpf.Migration(cqCounts, p.Stats.NumCPU(), func(h uint64) (int, bool) {
					cpu, ok := expected[h]
					return cpu, ok
				})
			}
			if reset {
				p.Stats.ResetAll()
			}
			sr.Paths = append(sr.Paths, pr)
		}
		rep.Sessions = append(rep.Sessions, sr)
	}

	for _, dd := range devices {
		dr := deviceReport{Device: ublk.BlockPath(dd.ID), SessName: dd.Spec.SessName, MapPath: dd.Spec.DevicePath, Transport: dd.Spec.Transport}
		err := blkErr
		if err == nil {
			var dev uint64
			if dev, err = bpf.DiskOf(dr.Device); err == nil {
				dr.Latency, err = blk.Histogram(dev)
			}
		}
		if err != nil {
			dr.LatencyOff = err.Error()
		}
		rep.Devices = append(rep.Devices, dr)
	}

	if devs, err := rdma.Devices(); err == nil {
		for _, dev := range devs {
			if irqs, err := rdma.CompletionIRQs(dev.Name); err == nil {
				rep.IRQs = append(rep.IRQs, irqs)
			}
		}
	}
	if reset {
		if err := d.obs.reset(); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// eventsOf returns the completion events of the CQ with user handle h,
// per CPU.
func eventsOf(counts []bpf.CQCount, h uint64, ncpu int) []uint64 {
	out := make([]uint64, ncpu)
	for _, c := range counts {
		if c.UserHandle == h && c.CPU >= 0 && c.CPU < ncpu {
			out[c.CPU] += c.Count
		}
	}
	return out
}

// pathFiles are a client path's statistics files in the order the text
// report prints them: the 6.12 files, then those of the 5.6 ABI
// (Documentation/ABI/testing/sysfs-class-rtrs-client) that 6.12 dropped,
// then rdma_lat in µs.
var pathFiles = []struct {
	name   string
	append func(*rtrs.ClientStatsSnapshot, []byte) []byte
}{
	{rtrs.StatCPUMigrationFrom, (*rtrs.ClientStatsSnapshot).AppendCPUMigrationFrom},
	{rtrs.StatCPUMigrationTo, (*rtrs.ClientStatsSnapshot).AppendCPUMigrationTo},
	{rtrs.StatReconnects, (*rtrs.ClientStatsSnapshot).AppendReconnects},
	{rtrs.StatRdma, (*rtrs.ClientStatsSnapshot).AppendRdma},
	{rtrs.StatResetAll, (*rtrs.ClientStatsSnapshot).AppendResetAll},
	{rtrs.StatSGEntries, (*rtrs.ClientStatsSnapshot).AppendSGEntries},
	{rtrs.StatCPUMigration, (*rtrs.ClientStatsSnapshot).AppendCPUMigration},
	{rtrs.StatRdmaLat, (*rtrs.ClientStatsSnapshot).AppendRdmaLat},
	{rtrs.StatRdmaLatUs, (*rtrs.ClientStatsSnapshot).AppendRdmaLatUs},
	{rtrs.StatWcCompletion, (*rtrs.ClientStatsSnapshot).AppendWcCompletion},
}

// appendFile appends one statistics file: a one-line file as "name: text",
// a longer one under "name:", indented.
func appendFile(b []byte, indent, name string, text []byte) []byte {
	if bytes.Count(text, []byte("\n")) <= 1 {
		return fmt.Appendf(b, "%s%-20s %s", indent, name+":", text)
	}
	b = fmt.Appendf(b, "%s%s:\n", indent, name)
	for _, l := range bytes.Split(bytes.TrimRight(text, "\n"), []byte("\n")) {
		b = fmt.Appendf(b, "%s    %s\n", indent, l)
	}
	return b
}

// isMigrationFile reports whether a file shows cpu_migration counts.
func isMigrationFile(name string) bool { return strings.HasPrefix(name, rtrs.StatCPUMigration) }

// appendText renders the report for people: every path's files in the
// kernel's formats, each device's eBPF latency, the RDMA interrupts.
func (r *statsReport) appendText(b []byte) []byte {
	for _, s := range r.Sessions {
		for _, p := range s.Paths {
			b = fmt.Appendf(b, "session %s (%s) path %d %s (%s)\n", s.Name, s.Transport, p.Index, p.Addr, p.State)
			if p.LastError != "" {
				b = fmt.Appendf(b, "  last connect error: %s\n", p.LastError)
			}
			b = appendFile(b, "  ", "cur_latency", fmt.Appendf(nil, "%d ns\n", p.CurLatencyNs))
			for _, f := range pathFiles {
				if isMigrationFile(f.name) && p.CPUMigration != "ebpf" {
					b = appendFile(b, "  ", f.name, fmt.Appendf(nil, "(%s)\n", p.CPUMigration))
					continue
				}
				b = appendFile(b, "  ", f.name, f.append(p.Stats, nil))
			}
			if len(p.Queues) > 0 {
				b = append(b, "  completion events per queue (eBPF), by the CPU they were raised on:\n"...)
				for _, q := range p.Queues {
					b = fmt.Appendf(b, "    queue %d (polled on CPU%d by thread %d): %v\n", q.Queue, q.CPU, q.TID, q.PerCPU)
				}
			}
		}
	}
	for _, d := range r.Devices {
		b = fmt.Appendf(b, "device %s (session %s, %s)\n", d.Device, d.SessName, d.MapPath)
		if d.Latency == nil {
			b = fmt.Appendf(b, "  block latency: (eBPF unavailable: %s)\n", d.LatencyOff)
			continue
		}
		h := d.Latency
		b = fmt.Appendf(b, "  requests (eBPF):     %d %d %d\n", h.Count[bpf.Read], h.Count[bpf.Write], h.Count[bpf.Other])
		b = appendFile(b, "  ", "block rdma_lat", h.AppendRdmaLat(nil))
		b = appendFile(b, "  ", "block rdma_lat_us", h.AppendLatUs(nil))
	}
	for _, dev := range r.IRQs {
		switch {
		case dev.Software:
			b = fmt.Appendf(b, "rdma %s: software device, no completion interrupts (completions are raised in the network softirq or the driver's work item that processed the packet)\n", dev.Device)
		case len(dev.IRQs) == 0:
			b = fmt.Appendf(b, "rdma %s: no interrupts found\n", dev.Device)
		default:
			b = fmt.Appendf(b, "rdma %s interrupts:\n", dev.Device)
			for _, irq := range dev.IRQs {
				b = fmt.Appendf(b, "  irq %d %s: affinity %s effective %s per-CPU %v\n", irq.Num, irq.Name, irq.Affinity, irq.Effective, irq.PerCPU)
			}
		}
	}
	return fmt.Appendf(b, "ebpf: block latency %s; completion CPU %s\n", r.EBPF.BlockLatency, r.EBPF.CompletionCPU)
}

// writeReport prints the report as text or JSON.
func (r *statsReport) write(w io.Writer, format string) error {
	if format == "json" {
		return writeJSON(w, r)
	}
	_, err := w.Write(r.appendText(nil))
	return err
}

// writeJSON writes v to w as indented JSON: the --format json of every command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// formatFlags are --format (text-like default, or json) and --json.
func formatFlags(def string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "format", Value: def, Usage: def + " or json"},
		&cli.BoolFlag{Name: "json", Usage: "same as --format json"},
	}
}

// outputFormat returns the format formatFlags chose: def or json.
func outputFormat(c *cli.Context, def string) (string, error) {
	format := c.String("format")
	if c.Bool("json") {
		format = "json"
	}
	if format != def && format != "json" {
		return "", fmt.Errorf("--format %q: want %s or json: %w", format, def, unix.EINVAL)
	}
	return format, nil
}

// fetchStats asks the client daemon for its statistics.
func fetchStats(reset bool) (*statsReport, error) {
	rep, err := askDaemon(&clientd.Request{Op: "stats", Force: reset}, "no mapped device")
	if err != nil {
		return nil, err
	}
	if rep.Stats == nil {
		return nil, fmt.Errorf("client daemon sent no statistics: %w", unix.EPROTO)
	}
	var st statsReport
	if err := json.Unmarshal(rep.Stats, &st); err != nil {
		return nil, fmt.Errorf("client daemon's statistics: %v: %w", err, unix.EPROTO)
	}
	return &st, nil
}

func statsCommand() *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "print every path's RTRS statistics in the kernel's formats, and the eBPF block latency of every mapped device",
		Description: "Per session and path: cur_latency, cpu_migration_from/_to, reconnects, rdma and reset_all as in Linux 6.12,\n" +
			"and sg_entries, cpu_migration, rdma_lat and wc_completion as the 5.6 ABI documented them, plus rdma_lat in µs.\n" +
			"cpu_migration counts RDMA completion events raised on another CPU than the queue thread polling the CQ\n" +
			"(eBPF on ib_uverbs_comp_handler). Per device: block request latency, issue to completion (eBPF block tracepoints).\n" +
			"Parts that need eBPF say why they are missing when it is not available.",
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "reset", Usage: "print, then reset the counters (as echo 1 > reset_all) and the eBPF histograms"},
		}, formatFlags("text")...),
		Action: func(c *cli.Context) error {
			format, err := outputFormat(c, "text")
			if err != nil {
				return fmt.Errorf("stats: %w", err)
			}
			r, err := fetchStats(c.Bool("reset"))
			if err != nil {
				return fmt.Errorf("stats: %w", err)
			}
			return r.write(os.Stdout, format)
		},
	}
}
