package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
)

// TestLabCLIClientHandover replaces the client daemon under fio verify
// with `urnbd client handover`: the old daemon lets its requests finish,
// closes the device on the server and exits with status 75 (its socket's
// caller sees none of that); the command starts the next daemon, which
// recovers the device at once (the server has no second writer to refuse),
// and fio ends with 0 errors. Over TCP and over RDMA (two paths).
func TestLabCLIClientHandover(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		c := newLabCLI(t)
		srv := newRestartableServer(t, c, imageDir(t, 256<<20))
		dev := c.must("map", "sessname=ho", "dest_port="+srv.port, "path=ip:127.0.0.1", "device_path=a.img")
		t.Cleanup(func() { c.run("unmap", "--force", dev) })
		handoverUnderFio(t, c, dev, "64M")
	})
	t.Run("rdma", func(t *testing.T) {
		c := newLabCLI(t)
		provisionRDMA(t)
		handoverUnderFio(t, c, c.mapOverTwoRDMAPaths(t, "hor", 1252), "32M")
	})
}

func handoverUnderFio(t *testing.T, c *labCLI, dev, size string) {
	fio := startFio(t, labtest.VerifyArgs(dev, size))
	time.Sleep(1500 * time.Millisecond)
	if !fio.running() {
		t.Fatal("fio ended before the handover; the test proves nothing")
	}
	old := readDaemonPID(t, c)
	start := time.Now()
	out := c.must("client", "handover")
	took := time.Since(start)
	t.Logf("urnbd client handover (%v):\n%s", took, out)
	if !strings.Contains(out, dev+": handed over (") {
		t.Errorf("handover did not report %s handed over", dev)
	}
	if !strings.Contains(out, dev+": served by the next daemon") || !strings.Contains(out, ", open") {
		t.Errorf("handover did not report %s open by the next daemon", dev)
	}
	if syscall.Kill(old, 0) == nil {
		t.Errorf("the old daemon (pid %d) still runs", old)
	}
	if now := readDaemonPID(t, c); now == old {
		t.Errorf("the daemon's pid is still %d", now)
	}
	if !fio.running() {
		t.Error("fio ended during the handover")
	}
	res, stderr, err := fio.wait(t, 3*time.Minute)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify across a handover: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify across a handover: %d I/Os, 0 errors", res.IOs())
	// Again, then without a next daemon, then with none running: ENOENT.
	c.must("client", "handover")
	if out, err := c.run("client", "handover", "--no-start"); err != nil {
		t.Errorf("handover --no-start: %v\n%s", err, out)
	}
	if out, err := c.run("client", "handover"); exitCodeOf(err) != int(syscall.ENOENT) {
		t.Errorf("handover with no daemon running: %v, want exit %d (ENOENT)\n%s", err, syscall.ENOENT, out)
	}
	c.must("list") // starts a daemon, which recovers the device for the cleanup's unmap
}

// readDaemonPID returns the client daemon's pid from its pid file.
func readDaemonPID(t *testing.T, c *labCLI) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.runDir, "client.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
