package main

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// urnbd ublk handover replaces a local device's server under fio verify:
// the old server exits, the next one serves the device, and fio sees no
// error. On a driver with quiesce a per-tag device is quiesced by the
// driver; batch devices and older drivers hold requests back instead.
func TestLabCLIUblkHandover(t *testing.T) {
	c := newLabCLI(t)
	var features struct {
		Used []string `json:"used"`
	}
	if err := json.Unmarshal([]byte(c.must("ublk", "features", "--json")), &features); err != nil {
		t.Fatal(err)
	}
	modes := [][]string{nil}
	if slices.Contains(features.Used, "batch_io") {
		modes = append(modes, []string{"--no-batch-io"})
	}
	var last string
	for _, mode := range modes {
		perTag := !slices.Contains(features.Used, "batch_io") || len(mode) > 0
		dev, old, fio := c.loopUnderVerify(mode...)
		last = dev
		id := strings.TrimPrefix(dev, "/dev/ublkb")
		start := time.Now()
		out := c.must("ublk", "handover", id)
		took := time.Since(start)
		want := "the queues held back new requests"
		if perTag && slices.Contains(features.Used, "quiesce") {
			want = "the ublk driver quiesced it"
		}
		if !strings.Contains(out, dev+": handed over ("+want+")") || !strings.Contains(out, dev+": served by the next server") {
			t.Errorf("handover %v printed:\n%s\nwant it handed over (%s) and served by the next server", mode, out, want)
		}
		if syscall.Kill(int(old.PID), 0) == nil {
			t.Errorf("the old server (pid %d) still runs", old.PID)
		}
		if n := c.entry(dev); n == nil || n.State != "live" || n.PID == old.PID {
			t.Errorf("after handover %v: %+v (old pid %d)", mode, n, old.PID)
		}
		if !fio.running() {
			t.Error("fio ended during the handover; it did not run across it")
		}
		res, stderr, err := fio.wait(t, 5*time.Minute)
		if err != nil || res.Errors() != 0 || res.IOs() == 0 {
			t.Fatalf("fio across the handover %v: %v, %d job errors, %d I/Os\n%s", mode, err, res.Errors(), res.IOs(), stderr)
		}
		t.Logf("fio verify across ublk handover %v (%s, %v): %d I/Os, 0 errors", mode, want, took.Round(time.Millisecond), res.IOs())
	}

	// --no-start leaves the device waiting; with no server, a handover
	// is refused with ENOENT and recover serves it again.
	id := strings.TrimPrefix(last, "/dev/ublkb")
	if out := c.must("ublk", "handover", "--no-start", id); !strings.Contains(out, "handed over") || strings.Contains(out, "next server (pid") {
		t.Errorf("handover --no-start printed:\n%s", out)
	}
	if n := c.entry(last); n == nil || n.State != "quiesced" {
		t.Errorf("after handover --no-start: %+v, want quiesced", n)
	}
	if out, err := c.run("ublk", "handover", id); exitCodeOf(err) != int(syscall.ENOENT) || !strings.Contains(out, "ublk recover "+id) {
		t.Errorf("handover with no server: %v %s; want ENOENT naming recover", err, out)
	}
	c.must("ublk", "recover", id)
	if n := c.entry(last); n == nil || n.State != "live" {
		t.Errorf("after recover: %+v", n)
	}

	// A device without user recovery cannot outlive its server: refused,
	// and its server keeps serving it.
	null := c.must("ublk", "add", "null", "--size", "1G", "--no-recovery")
	before := c.entry(null)
	out, err := c.run("ublk", "handover", strings.TrimPrefix(null, "/dev/ublkb"))
	if exitCodeOf(err) != int(syscall.EOPNOTSUPP) || !strings.Contains(out, "--no-recovery") {
		t.Errorf("handover of a --no-recovery device: %v %s; want EOPNOTSUPP naming --no-recovery", err, out)
	}
	if n := c.entry(null); before == nil || n == nil || n.State != "live" || n.PID != before.PID {
		t.Errorf("after the refused handover: %+v, before %+v", n, before)
	}
	// Its server, signalled by hand, refuses too and goes on serving.
	if err := syscall.Kill(int(before.PID), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n := c.entry(null); syscall.Kill(int(before.PID), 0) != nil || n == nil || n.State != "live" {
		t.Errorf("after SIGUSR1 to the server of a --no-recovery device: %+v, want it live with its server", n)
	}
	if out, err := c.run("ublk", "handover", "4000"); exitCodeOf(err) != int(syscall.ENODEV) {
		t.Errorf("handover of a missing device: %v %s; want ENODEV", err, out)
	}
}
