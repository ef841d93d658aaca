package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/urnbd/urnbd/internal/labtest"
)

// startServerCLI runs `urnbd server` exporting dir on a free loopback port.
func startServerCLI(t *testing.T, c *labCLI, dir string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := c.cmd("server", "--listen", "tcp://127.0.0.1:"+strconv.Itoa(port), "--dev-search-path", dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	if !labtest.WaitFor(10*time.Second, func() bool {
		conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			conn.Close()
		}
		return err == nil
	}) {
		t.Fatal("urnbd server did not start listening")
	}
	return port
}

func exitCodeOf(err error) int {
	var e *exec.ExitError
	if errors.As(err, &e) {
		return e.ExitCode()
	}
	return -1
}

// The user's path: urnbd server, urnbd map (kernel syntax and rnbd-tool
// syntax), list, fio verify, the errors of the kernel's map_device, unmap
// refusing a busy device, unmap --force.
func TestLabCLIMapOverTCP(t *testing.T) {
	c := newLabCLI(t)
	dir := t.TempDir()
	for _, n := range []string{"a.img", "b.img", "c.img"} {
		f, _ := os.Create(filepath.Join(dir, n))
		f.Truncate(256 << 20)
		f.Close()
	}
	port := strconv.Itoa(startServerCLI(t, c, dir))
	// With zero copy where the kernel has it (the fio verify below runs
	// on this one).
	dev := c.must("map", "--zero-copy", "sessname=lab", "dest_port="+port, "path=ip:127.0.0.1", "device_path=a.img")
	if !strings.HasPrefix(dev, "/dev/ublkb") {
		t.Fatalf("map printed %q", dev)
	}
	t.Cleanup(func() { c.run("unmap", "--force", dev) })

	out, err := c.run("map", "sessname=lab", "dest_port="+port, "path=ip:127.0.0.1", "device_path=a.img")
	if exitCodeOf(err) != int(syscall.EEXIST) || !strings.Contains(out, "already mapped") {
		t.Errorf("mapping the same device twice: %v %s; want EEXIST", err, out)
	}
	out, err = c.run("map", "sessname=lab", "dest_port="+port, "path=ip:127.0.0.1", "device_path=missing.img")
	if exitCodeOf(err) != int(syscall.ENOENT) {
		t.Errorf("mapping a missing device: %v %s; want ENOENT", err, out)
	}
	out, err = c.run("map", "sessname=lab", "dest_port="+port, "path=ip:127.0.0.1", "device_path=../a.img")
	if exitCodeOf(err) != int(syscall.EINVAL) {
		t.Errorf("a device path with '..': %v %s; want EINVAL", err, out)
	}
	out, err = c.run("map", "sessname=nosuch", "device_path=a.img")
	if exitCodeOf(err) != int(syscall.ENXIO) {
		t.Errorf("no path for a new session: %v %s; want ENXIO", err, out)
	}
	out, err = c.run("map", "sessname=lab", "transport=rdma", "device_path=c.img")
	if exitCodeOf(err) != int(syscall.EINVAL) || !strings.Contains(out, "runs over tcp") {
		t.Errorf("another transport for an existing session: %v %s; want EINVAL", err, out)
	}
	out, err = c.run("map", "--queues", "99", "sessname=lab", "device_path=c.img")
	if exitCodeOf(err) != int(syscall.EINVAL) || !strings.Contains(out, "queues") {
		t.Errorf("another queue count for an existing session: %v %s; want EINVAL", err, out)
	}
	// As with the kernel, a device of an existing session needs no path.
	dev3 := c.must("map", "sessname=lab", "device_path=c.img")
	if dev3 == dev || !strings.HasPrefix(dev3, "/dev/ublkb") {
		t.Errorf("map without path= on session lab printed %q", dev3)
	}
	c.must("unmap", dev3)

	// A session made for one device maps no second one.
	one := c.must("map", "--session-devices", "1", "sessname=one", "dest_port="+port, "path=ip:127.0.0.1", "device_path=c.img", "access_mode=ro")
	out, err = c.run("map", "sessname=one", "device_path=b.img", "access_mode=ro")
	if exitCodeOf(err) != int(syscall.ENOSPC) || !strings.Contains(out, "at most 1 devices") {
		t.Errorf("a second device in a session of one: %v %s; want ENOSPC", err, out)
	}
	out, err = c.run("map", "--session-devices", "2", "sessname=one", "device_path=b.img", "access_mode=ro")
	if exitCodeOf(err) != int(syscall.EINVAL) {
		t.Errorf("another device count for an existing session: %v %s; want EINVAL", err, out)
	}
	c.must("unmap", one)

	dev2 := c.must("client", "device", "map", "b.img", "from", "127.0.0.1", "dest_port="+port, "access_mode=ro")
	t.Cleanup(func() { c.run("unmap", "--force", dev2) })
	var entries []struct {
		Device     string   `json:"devname"`
		SessName   string   `json:"sessname"`
		MapPath    string   `json:"mapping_path"`
		AccessMode string   `json:"access_mode"`
		State      string   `json:"state"`
		Features   []string `json:"ublk_features"`
	}
	if err := json.Unmarshal([]byte(c.must("list", "--format", "json")), &entries); err != nil || len(entries) != 2 {
		t.Fatalf("list: %v %+v", err, entries)
	}
	// The features in use are what `ublk features` says urnbd uses on
	// this kernel (and what the driver adds by itself).
	var features struct {
		Offered []string `json:"offered"`
		Used    []string `json:"used"`
	}
	if err := json.Unmarshal([]byte(c.must("ublk", "features", "--json")), &features); err != nil || len(features.Used) == 0 {
		t.Fatalf("ublk features --json: %v %+v", err, features)
	}
	for _, e := range entries {
		if e.State != "open" || e.SessName == "" || (e.Device == dev) != (e.MapPath == "a.img") {
			t.Errorf("list entry %+v", e)
		}
		for _, f := range features.Used {
			if !slices.Contains(e.Features, f) {
				t.Errorf("%s: ublk_features %v lack %s, which urnbd uses on this kernel", e.Device, e.Features, f)
			}
		}
		// Over TCP the requests' own pages are used where the driver
		// offers it and the map asked for it (--zero-copy).
		if zc := e.Device == dev && slices.Contains(features.Offered, "auto_buf_reg"); slices.Contains(e.Features, "auto_buf_reg") != zc {
			t.Errorf("%s: ublk_features %v; want zero copy (auto_buf_reg) used: %v (offered: %v)", e.Device, e.Features, zc, features.Offered)
		}
		for _, f := range e.Features {
			if !slices.Contains(features.Offered, f) {
				t.Errorf("%s: ublk_features %v has %s, which the driver does not offer (%v)", e.Device, e.Features, f, features.Offered)
			}
		}
	}
	if out := c.must("list"); !strings.Contains(out, "a.img") || !strings.Contains(out, "b.img") || !strings.Contains(out, "ro") {
		t.Errorf("list table:\n%s", out)
	}
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+dev2, "bs=4k", "count=1", "oflag=direct").CombinedOutput(); err == nil {
		t.Errorf("a write to a read-only mapping succeeded: %s", out)
	}

	res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "64M")...)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify on %s: %v, %d errors\n%s", dev, err, res.Errors(), stderr)
	}

	st := c.must("stats")
	for _, want := range []string{"session lab (tcp) path 0", "rdma:", "reconnects:", "cpu_migration_from:", "rdma_lat:"} {
		if !strings.Contains(st, want) {
			t.Errorf("stats lacks %q:\n%s", want, st)
		}
	}
	if strings.Contains(st, "rdma:                0 0 0 0") {
		t.Errorf("stats count no I/O after fio:\n%s", st)
	}
	// A device held open cannot be unmapped normally.
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	out, err = c.run("unmap", dev)
	if exitCodeOf(err) != int(syscall.EBUSY) || !strings.Contains(out, "in use") {
		t.Errorf("unmap of an open device: %v %s; want EBUSY", err, out)
	}
	f.Close()
	c.must("unmap", dev)
	c.must("unmap", "--force", dev2)
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still exists after unmap", dev)
	}
	if out := c.must("list", "--format", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("list after unmap: %s", out)
	}
}

// TestLabCLIServerRestart kills the server under fio verify and starts it
// again: the client reopens its device on the new server, whose id for it
// differs from the old one (a device mapped before it was unmapped), and
// the held I/O goes on there: fio verify ends with 0 errors, and data
// written before the restart reads back.
func TestLabCLIServerRestart(t *testing.T) {
	c := newLabCLI(t)
	dir := t.TempDir()
	for _, n := range []string{"a.img", "b.img"} {
		f, _ := os.Create(filepath.Join(dir, n))
		f.Truncate(256 << 20)
		f.Close()
	}
	srv := newRestartableServer(t, c, dir)
	port := srv.port

	devB := c.must("map", "sessname=rs", "dest_port="+port, "path=ip:127.0.0.1", "device_path=b.img")
	devA := c.must("map", "sessname=rs", "device_path=a.img")
	t.Cleanup(func() { c.run("unmap", "--force", devA) })
	c.must("unmap", devB) // a.img stays device 1; the next server makes it 0

	before := make([]byte, 1<<20)
	for i := range before {
		before[i] = byte(i*7 + 3)
	}
	writeAt(t, devA, before, 200<<20)

	fio := startFio(t, labtest.VerifyArgs(devA, "64M"))
	time.Sleep(1500 * time.Millisecond)
	if !fio.running() {
		t.Fatal("fio ended before the server was killed; the test proves nothing")
	}
	srv.kill()
	if !labtest.WaitFor(10*time.Second, func() bool { return strings.Contains(c.must("list"), "closed") }) {
		t.Errorf("list while the server is down:\n%s", c.must("list"))
	}
	srv.start()
	res, stderr, err := fio.wait(t, 3*time.Minute)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify across a server restart: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify across a server restart: %d I/Os, 0 errors", res.IOs())
	if got := readAt(t, devA, len(before), 200<<20); !bytes.Equal(got, before) {
		t.Error("data written before the restart reads back changed")
	}
	if out := c.must("list"); !strings.Contains(out, "a.img") || !strings.Contains(out, "connected") || !strings.Contains(out, " open ") {
		t.Errorf("list after the restart:\n%s", out)
	}
}

// restartableServer is a urnbd server over TCP on a port that stays the
// same across kill and start.
type restartableServer struct {
	t    *testing.T
	c    *labCLI
	dir  string
	port string
	cmd  *exec.Cmd
}

func newRestartableServer(t *testing.T, c *labCLI, dir string) *restartableServer {
	s := &restartableServer{t: t, c: c, dir: dir, port: strconv.Itoa(freePort(t))}
	s.start()
	t.Cleanup(func() {
		if s.cmd != nil {
			s.cmd.Process.Signal(syscall.SIGTERM)
			s.cmd.Wait()
		}
	})
	return s
}

func (s *restartableServer) start() {
	s.t.Helper()
	s.cmd = s.c.cmd("server", "--listen", "tcp://127.0.0.1:"+s.port, "--dev-search-path", s.dir)
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	if !labtest.WaitFor(10*time.Second, func() bool {
		conn, err := net.Dial("tcp", "127.0.0.1:"+s.port)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}) {
		s.t.Fatal("urnbd server did not start listening")
	}
}

// kill kills the server with SIGKILL, as a crash would.
func (s *restartableServer) kill() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

func writeAt(t *testing.T, dev string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedCopy(b)
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
}

func readAt(t *testing.T, dev string, n int, off int64) []byte {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedCopy(make([]byte, n))
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	return buf
}

// alignedCopy returns a copy of b in a 4 KiB-aligned buffer (O_DIRECT).
func alignedCopy(b []byte) []byte {
	raw := make([]byte, len(b)+4096)
	off := int(-uintptr(unsafe.Pointer(&raw[0])) & 4095)
	out := raw[off : off+len(b)]
	copy(out, b)
	return out
}

// TestLabCLIClientDaemonDies kills the client daemon with SIGKILL under fio
// verify: the device waits, quiesced (ublk user recovery), and the daemon
// started again serves it again from its record; fio ends with 0 errors.
// Over TCP and over RDMA (two paths).
func TestLabCLIClientDaemonDies(t *testing.T) {
	mapTCP := func(t *testing.T) (*labCLI, *restartableServer, string) {
		c := newLabCLI(t)
		srv := newRestartableServer(t, c, imageDir(t, 256<<20))
		dev := c.must("map", "sessname=dd", "dest_port="+srv.port, "path=ip:127.0.0.1", "device_path=a.img")
		t.Cleanup(func() { c.run("unmap", "--force", dev) })
		return c, srv, dev
	}
	t.Run("tcp", func(t *testing.T) {
		c, _, dev := mapTCP(t)
		killDaemonUnderFio(t, c, dev, "64M", nil, nil)
	})
	t.Run("tcp, server down meanwhile", func(t *testing.T) {
		c, srv, dev := mapTCP(t)
		// The daemon that starts finds no server: it keeps trying, and
		// recovers the device once the server is back.
		killDaemonUnderFio(t, c, dev, "64M", srv.kill, srv.start)
	})
	t.Run("rdma", func(t *testing.T) {
		// The daemon loads the completion CPU probe with RDMA sessions.
		// When it was fentry, a killed daemon sometimes never exited: the
		// release of the probe's BPF trampoline waited in
		// synchronize_rcu_tasks for good. It is a kprobe now.
		c := newLabCLI(t)
		provisionRDMA(t)
		killDaemonUnderFio(t, c, c.mapOverTwoRDMAPaths(t, "ddr", 1251), "32M", nil, nil)
	})
}

// killDaemonUnderFio kills the client daemon under fio verify on dev and
// has a new one recover the device; between the two, if not nil,
// whileDead runs before the new daemon starts and afterStart after.
func killDaemonUnderFio(t *testing.T, c *labCLI, dev, size string, whileDead, afterStart func()) {
	fio := startFio(t, labtest.VerifyArgs(dev, size))
	time.Sleep(1500 * time.Millisecond)
	if !fio.running() {
		t.Fatal("fio ended before the daemon was killed; the test proves nothing")
	}
	pid := readDaemonPID(t, c)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !labtest.WaitFor(10*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
		t.Fatal("the client daemon outlived SIGKILL")
	}
	time.Sleep(500 * time.Millisecond)
	if !fio.running() {
		t.Fatal("fio ended with the daemon: the device did not wait")
	}
	if whileDead != nil {
		whileDead()
	}
	// Any command that needs the daemon starts one, which recovers the
	// device before it answers, or keeps trying: until the kernel has
	// noticed the dead daemon (its monitor runs every 5 s; under TCG the
	// RDMA teardown of a killed process takes a while too), and while the
	// server is away.
	c.must("list")
	if afterStart != nil {
		afterStart()
	}
	if !labtest.WaitFor(2*time.Minute, func() bool {
		out := c.must("list")
		return strings.Contains(out, "a.img") && strings.Contains(out, " open ")
	}) {
		t.Errorf("the device was not recovered within 2 minutes:\n%s", c.must("list"))
	}
	res, stderr, err := fio.wait(t, 3*time.Minute)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio verify across a client daemon's death: %v, %d errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio verify across a client daemon's death: %d I/Os, 0 errors", res.IOs())
}
