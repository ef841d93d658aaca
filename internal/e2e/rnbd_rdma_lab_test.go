package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// RNBD over RTRS/RDMA on soft-RoCE, two paths: fio verify passes while one
// path's link goes down in the middle.
func TestLabRNBDOverRDMATwoPaths(t *testing.T) {
	provisionRDMA(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	os.WriteFile(img, nil, 0o600)
	os.Truncate(img, 512<<20)
	srv, err := rnbd.NewServer(rnbd.ServerConfig{DevSearchPath: dir, MaxIOSize: 126976, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rdmatr.NewServer(rdmatr.ServerConfig{QueueDepth: 128, Handler: srv.RDMA(),
		HeartbeatInterval: 500 * time.Millisecond, MissedHeartbeats: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for _, a := range []string{"192.0.2.2:1240", "198.51.100.2:1240"} {
		if _, err := rs.Listen(netip.MustParseAddrPort(a)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rnbd.DialRDMA(ctx, rdmatr.ClientConfig{SessName: "e2e-rdma", Queues: 2, Policy: rtrs.RoundRobin,
		Paths:                []rdmatr.PathAddr{{Src: "192.0.2.1", Dst: "192.0.2.2:1240"}, {Src: "198.51.100.1", Dst: "198.51.100.2:1240"}},
		MaxReconnectAttempts: -1, ReconnectDelay: 500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		MissedHeartbeats: 3, Timeout: 5 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctrl, err := ublk.OpenControl()
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	d, err := c.Map(ctx, ctrl, "disk.img", rnbd.AccessRW, rnbd.MapOptions{ID: -1, Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Unmap(context.Background())
	dev := ublk.BlockPath(d.UblkDevice().ID())

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
}
