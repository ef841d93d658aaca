package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/ublk"
)

// provisionRDMA sets up the lab's soft-RoCE paths (idempotent).
func provisionRDMA(t *testing.T) {
	t.Helper()
	labtest.Need(t, "/dev/ublk-control", "ublk_drv")
	_, file, _, _ := runtime.Caller(0)
	prov := filepath.Join(filepath.Dir(file), "..", "..", "tools", "lab", "provision.sh")
	for _, mode := range []string{"modules", "rdma"} {
		if out, err := exec.Command(prov, mode).CombinedOutput(); err != nil {
			t.Fatalf("provision.sh %s: %v\n%s", mode, err, out)
		}
	}
	labtest.Need(t, "/dev/infiniband/rdma_cm", "rdma_ucm")
}

// RNBD over RTRS/RDMA with the backend I/O on the server loop's own
// io_uring (LoopIO): fio verify of reads, writes and flushes passes.
func TestLabRNBDOverRDMALoopIO(t *testing.T) {
	provisionRDMA(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	os.WriteFile(img, nil, 0o600)
	os.Truncate(img, 256<<20)
	defer serveRDMAWith(t, rnbd.ServerConfig{DevSearchPath: dir, LoopIO: true}, "192.0.2.2:1241")()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rnbd.DialRDMA(ctx, rtrs.ClientConfig{SessName: "e2e-loopio", Queues: 2,
		Paths: []rdmatr.PathAddr{{Src: "192.0.2.1", Dst: "192.0.2.2:1241"}}, Timeout: 5 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d, err := c.Map(ctx, openControl(t), "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Unmap(context.Background())
	dev := ublk.BlockPath(d.UblkDevice().ID())
	res, stderr, err := labtest.Fio(t, append(labtest.VerifyArgs(dev, "64M"), "--fsync=16")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify over RNBD/RDMA with LoopIO: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify over RNBD/RDMA, backend I/O on the server loop: %d I/Os, 0 errors", res.IOs())
}

// RNBD over RTRS/RDMA on soft-RoCE, two paths: fio verify passes while one
// path's link goes down in the middle.
func TestLabRNBDOverRDMATwoPaths(t *testing.T) {
	provisionRDMA(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	os.WriteFile(img, nil, 0o600)
	os.Truncate(img, 512<<20)
	defer serveRDMA(t, dir, "192.0.2.2:1240", "198.51.100.2:1240")()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var leaked atomic.Bool
	pinned0 := vmPin(t)
	c, err := rnbd.DialRDMA(ctx, rtrs.ClientConfig{SessName: "e2e-rdma", Queues: 2, Policy: rtrs.RoundRobin,
		Paths:                []rdmatr.PathAddr{{Src: "192.0.2.1", Dst: "192.0.2.2:1240"}, {Src: "198.51.100.1", Dst: "198.51.100.2:1240"}},
		MaxReconnectAttempts: -1, ReconnectDelay: 500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		MissedHeartbeats: 3, Timeout: 5 * time.Second, Logf: func(format string, args ...any) {
			if strings.Contains(format, "did not release") {
				leaked.Store(true)
			}
			t.Logf(format, args...)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctrl := openControl(t)
	d, err := c.Map(ctx, ctrl, "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	unmapped := false
	defer func() {
		if !unmapped {
			d.Unmap(context.Background())
		}
	}()
	dev := ublk.BlockPath(d.UblkDevice().ID())
	// Registered memory is pinned (VmPin), once per path. The session pins
	// the tag buffers of its one device, 2 queues × 128 tags × 128 KiB per
	// path, not those of all 4 devices it could map.
	const perDevice = 2 * 128 * 128 << 10
	pinned := vmPin(t) - pinned0
	t.Logf("pinned since the session was dialled: %d MiB (2 paths, 1 device mapped)", pinned>>20)
	if pinned >= 2*2*perDevice {
		t.Errorf("the session pins %d MiB over 2 paths with 1 device mapped, want < %d MiB", pinned>>20, 2*2*perDevice>>20)
	}

	res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "64M")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify over RNBD/RDMA: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify over RNBD/RTRS/RDMA, two paths: %d I/Os, 0 errors", res.IOs())

	// Path 2 fails under load: its link goes down, I/O carries on over path 1.
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, stderr, err = labtest.Fio(t, labtest.VerifyArgs(dev, "96M")...)
	}()
	time.Sleep(2 * time.Second)
	labtest.Run(t, "ip", "link", "set", "veth2", "down")
	// Bringing the link back is not enough: its routes went with it.
	// Provisioning again restores them for the tests that follow.
	defer provisionRDMA(t)
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("fio hangs after a path went down")
	}
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify with a path going down: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	for _, p := range c.Paths() {
		t.Logf("path %s: %s, stats/rdma %s", p.Addr, p.State, p.Stats.AppendRdma(nil))
	}
	t.Logf("fio verify across the link failure: %d I/Os, 0 errors", res.IOs())

	// Path 1 goes down and comes back while no device drives the queues:
	// mapped again, the same queues must drop the old connections without
	// touching them (the path may have freed them) and take the new ones.
	unmapped = true
	if err := d.Unmap(context.Background()); err != nil {
		t.Fatalf("unmap: %v", err)
	}
	state := func() string { return c.Paths()[0].State }
	if err := c.PathOp(0, rnbd.PathDisconnect); err != nil {
		t.Fatalf("disconnect path 1: %v", err)
	}
	if !labtest.WaitFor(20*time.Second, func() bool { return state() != "connected" }) {
		t.Fatalf("path 1 still connected after disconnect")
	}
	if err := c.PathOp(0, rnbd.PathReconnect); err != nil {
		t.Fatalf("reconnect path 1: %v", err)
	}
	if !labtest.WaitFor(30*time.Second, func() bool { return state() == "connected" }) {
		t.Fatalf("path 1 is %s 30 s after reconnect", state())
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	d, err = c.Map(ctx2, ctrl, "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatalf("map again: %v", err)
	}
	unmapped = false
	dev = ublk.BlockPath(d.UblkDevice().ID())
	res, stderr, err = labtest.Fio(t, labtest.VerifyArgs(dev, "32M")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify after path 1 went down and came back unmapped: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify on the device mapped again, after path 1 went down and came back while unmapped: %d I/Os, 0 errors", res.IOs())

	// Unmapped, the device's queues are no longer driven: closing the
	// session must still free both paths' connections, without waiting
	// for those queues (Timeout) and leaking them.
	unmapped = true
	if err := d.Unmap(context.Background()); err != nil {
		t.Fatalf("unmap: %v", err)
	}
	t0 := time.Now()
	c.Close()
	if el := time.Since(t0); el > 4*time.Second {
		t.Errorf("closing the session took %v", el)
	}
	if leaked.Load() {
		t.Error("closing the session leaked a path's connections: a queue of the unmapped device held them")
	}
}

// vmPin returns the memory the test process has pinned (VmPin in
// /proc/self/status), as RDMA registrations do, in bytes.
func vmPin(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmPin:"); ok {
			var kb int64
			if _, err := fmt.Sscan(rest, &kb); err != nil {
				t.Fatalf("VmPin: %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmPin in /proc/self/status")
	return 0
}

// TestLabRNBDOverRDMAServerRestart closes the RDMA server under fio verify
// and starts a new one: the client reopens its device there, under an id
// other than the old one, before the held I/O goes on; fio ends with 0
// errors.
func TestLabRNBDOverRDMAServerRestart(t *testing.T) {
	provisionRDMA(t)
	dir := t.TempDir()
	for _, n := range []string{"a.img", "b.img"} {
		img := filepath.Join(dir, n)
		os.WriteFile(img, nil, 0o600)
		os.Truncate(img, 256<<20)
	}
	const addr = "192.0.2.2:1241"
	stop := serveRDMA(t, dir, addr)
	defer func() { stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rnbd.DialRDMA(ctx, rtrs.ClientConfig{SessName: "e2e-restart", Queues: 2,
		Paths:                []rdmatr.PathAddr{{Src: "192.0.2.1", Dst: addr}},
		MaxReconnectAttempts: -1, ReconnectDelay: 500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		MissedHeartbeats: 3, Timeout: 5 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctrl := openControl(t)
	db, err := c.Map(ctx, ctrl, "b.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Map(ctx, ctrl, "a.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Unmap(context.Background())
	if err := db.Unmap(ctx); err != nil {
		t.Fatal(err)
	}
	oldID := d.ID()

	dev := ublk.BlockPath(d.UblkDevice().ID())
	done := make(chan struct{})
	var res *labtest.FioResult
	var stderr string
	go func() {
		defer close(done)
		res, stderr, err = labtest.Fio(t, labtest.VerifyArgs(dev, "48M")...)
	}()
	time.Sleep(2 * time.Second)
	stop()
	time.Sleep(time.Second)
	stop = serveRDMA(t, dir, addr)
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("fio hung after the server restart; paths %+v", c.Paths())
	}
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify across an RDMA server restart: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	if d.ID() == oldID {
		t.Errorf("device id %d after the restart, as before: was the device reopened?", d.ID())
	}
	t.Logf("fio verify across an RDMA server restart: %d I/Os, 0 errors; device id %d, was %d", res.IOs(), d.ID(), oldID)
}

// openControl opens the ublk control device until the test ends.
func openControl(t *testing.T) *ublk.Control {
	t.Helper()
	ctrl, err := ublk.OpenControl()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrl.Close() })
	return ctrl
}

// serveRDMA starts an RNBD server exporting dir over RTRS/RDMA on addrs;
// the function it returns stops it.
func serveRDMA(t *testing.T, dir string, addrs ...string) (stop func()) {
	t.Helper()
	return serveRDMAWith(t, rnbd.ServerConfig{DevSearchPath: dir}, addrs...)
}

// serveRDMAWith is serveRDMA with the RNBD server's configuration.
func serveRDMAWith(t *testing.T, cfg rnbd.ServerConfig, addrs ...string) (stop func()) {
	t.Helper()
	cfg.MaxIOSize, cfg.Logf = 126976, t.Logf
	srv, err := rnbd.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rdmatr.NewServer(rdmatr.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 128, HeartbeatInterval: 500 * time.Millisecond, MissedHeartbeats: 3}, Handler: srv.RDMA()})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if _, err := rs.Listen(netip.MustParseAddrPort(a)); err != nil {
			rs.Close()
			t.Fatal(err)
		}
	}
	return func() { rs.Close(); srv.Close() }
}
