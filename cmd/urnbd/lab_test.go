package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
)

// labCLI runs the urnbd binary with a private run directory.
type labCLI struct {
	t      *testing.T
	bin    string
	runDir string
}

func newLabCLI(t *testing.T) *labCLI {
	labtest.NeedUblk(t)
	c := &labCLI{t: t, bin: labtest.Binary(t), runDir: t.TempDir()}
	t.Cleanup(func() {
		c.run("ublk", "del", "--all")
		if log, err := os.ReadFile(filepath.Join(c.runDir, "urnbd.log")); err == nil && t.Failed() {
			t.Logf("client daemon log:\n%s", log)
		}
	})
	return c
}

func (c *labCLI) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(os.Environ(), "URNBD_RUN_DIR="+c.runDir)
	return cmd
}

func (c *labCLI) run(args ...string) (string, error) {
	out, err := c.cmd(args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (c *labCLI) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("urnbd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (c *labCLI) list() []ublkListEntry {
	c.t.Helper()
	var entries []ublkListEntry
	if err := json.Unmarshal([]byte(c.must("ublk", "list", "--format", "json")), &entries); err != nil {
		c.t.Fatal(err)
	}
	return entries
}

func (c *labCLI) entry(dev string) *ublkListEntry {
	for _, e := range c.list() {
		if e.Device == dev {
			return &e
		}
	}
	return nil
}

func TestLabCLIAddListDel(t *testing.T) {
	c := newLabCLI(t)
	file := labtest.SparseFile(t, 64<<20)
	dev := c.must("ublk", "add", "loop", "--file", file, "--queues", "2")
	if !strings.HasPrefix(dev, "/dev/ublkb") {
		t.Fatalf("add printed %q, want a device path", dev)
	}
	null := c.must("ublk", "add", "null", "--size", "2G")
	e := c.entry(dev)
	if e == nil || e.Target != "loop" || e.Backing != file || e.State != "live" || e.SizeBytes != 64<<20 || e.Queues != 2 {
		t.Errorf("list entry for %s: %+v", dev, e)
	}
	if n := c.entry(null); n == nil || n.Target != "null" || n.SizeBytes != 2<<30 {
		t.Errorf("list entry for %s: %+v", null, n)
	}
	table := c.must("ublk", "list")
	if !strings.Contains(table, dev) || !strings.Contains(table, file) {
		t.Errorf("table lacks the device:\n%s", table)
	}
	// resize: where the driver has update_size (7.x) the block device
	// grows; elsewhere it is refused with EOPNOTSUPP and nothing changes.
	var features struct {
		Used []string `json:"used"`
	}
	if err := json.Unmarshal([]byte(c.must("ublk", "features", "--json")), &features); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimPrefix(null, "/dev/ublkb")
	out, err := c.run("ublk", "resize", id, "3G")
	if slices.Contains(features.Used, "update_size") {
		if n := c.entry(null); err != nil || n == nil || n.SizeBytes != 3<<30 {
			t.Errorf("resize to 3G: %v %s; list entry %+v", err, out, n)
		}
		if out, err := c.run("ublk", "resize", id, "1000"); exitCodeOf(err) != int(syscall.EINVAL) {
			t.Errorf("resize to 1000 bytes: %v %s; want EINVAL", err, out)
		}
	} else if exitCodeOf(err) != int(syscall.EOPNOTSUPP) || !strings.Contains(out, "update_size") {
		t.Errorf("resize without update_size: %v %s; want EOPNOTSUPP naming it", err, out)
	}
	c.must("ublk", "del", dev)
	if c.entry(dev) != nil {
		t.Errorf("%s still listed after del", dev)
	}
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("%s still exists", dev)
	}
	// The daemon exits once its device is gone.
	if c.entry(null) == nil {
		t.Fatalf("%s vanished", null)
	}
}

func TestLabCLIErrors(t *testing.T) {
	c := newLabCLI(t)
	missing := filepath.Join(t.TempDir(), "no-such-file")
	out, err := c.run("ublk", "add", "loop", "--file", missing)
	var exit *exec.ExitError
	if err == nil || !errors.As(err, &exit) || exit.ExitCode() != int(syscall.ENOENT) {
		t.Errorf("add with a missing file: %v, want exit status ENOENT (2)\n%s", err, out)
	}
	if !strings.Contains(out, missing) {
		t.Errorf("message does not name the file: %s", out)
	}
	out, err = c.run("ublk", "del", "4000")
	if err == nil || !strings.Contains(out, "does not exist") {
		t.Errorf("del of a missing device: %v %s", err, out)
	}
	out, err = c.run("ublk", "add", "null", "--size", "lots")
	if err == nil || !strings.Contains(out, "size") {
		t.Errorf("bad size: %v %s", err, out)
	}
}

// bgFio is fio running in the background.
type bgFio struct {
	out    string
	stderr strings.Builder
	done   chan struct{}
	err    error
}

// startFio runs fio in the background.
func startFio(t *testing.T, args []string) *bgFio {
	labtest.NeedCommand(t, "fio")
	f := &bgFio{out: filepath.Join(t.TempDir(), "fio.json"), done: make(chan struct{})}
	cmd := exec.Command("fio", append([]string{"--output-format=json", "--output=" + f.out}, args...)...)
	cmd.Stderr = &f.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { f.err = cmd.Wait(); close(f.done) }()
	return f
}

func (f *bgFio) running() bool {
	select {
	case <-f.done:
		return false
	default:
		return true
	}
}

// wait waits for fio to end, up to timeout, and returns its result.
func (f *bgFio) wait(t *testing.T, timeout time.Duration) (*labtest.FioResult, string, error) {
	select {
	case <-f.done:
	case <-time.After(timeout):
		t.Fatalf("fio still running after %v: hung", timeout)
	}
	var res labtest.FioResult
	b, _ := os.ReadFile(f.out)
	if i := strings.IndexByte(string(b), '{'); i >= 0 {
		json.Unmarshal(b[i:], &res)
	}
	return &res, f.stderr.String(), f.err
}

// loopUnderVerify adds a loop device of two queues on a new sparse file
// (with the add flags given) and starts fio verify on it; it returns once
// fio is well under way.
func (c *labCLI) loopUnderVerify(addFlags ...string) (string, *ublkListEntry, *bgFio) {
	c.t.Helper()
	file := labtest.SparseFile(c.t, 256<<20)
	dev := c.must(append([]string{"ublk", "add", "loop", "--file", file, "--queues", "2"}, addFlags...)...)
	e := c.entry(dev)
	if e == nil {
		c.t.Fatal("device not listed")
	}
	fio := startFio(c.t, labtest.VerifyArgs(dev, "128M"))
	time.Sleep(1500 * time.Millisecond)
	if !fio.running() {
		c.t.Fatal("fio ended within 1.5 s; the test would prove nothing")
	}
	return dev, e, fio
}

func TestLabCLIRecoverUnderLoad(t *testing.T) {
	c := newLabCLI(t)
	dev, e, fio := c.loopUnderVerify()
	if err := syscall.Kill(int(e.PID), syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", e.PID, err)
	}
	if !labtest.WaitFor(15*time.Second, func() bool {
		n := c.entry(dev)
		return n != nil && n.State == "quiesced"
	}) {
		t.Fatalf("device did not become quiesced after its server died: %+v", c.entry(dev))
	}
	if _, err := os.Stat(dev); err != nil {
		t.Fatalf("device disappeared with its server: %v", err)
	}
	id := strings.TrimPrefix(dev, "/dev/ublkb")
	c.must("ublk", "recover", id)
	n := c.entry(dev)
	if n == nil || n.State != "live" || n.PID == e.PID {
		t.Fatalf("after recover: %+v", n)
	}
	res, stderr, err := fio.wait(t, 5*time.Minute)
	if err != nil || res.Errors() != 0 || res.IOs() == 0 {
		t.Fatalf("fio across the restart: %v, %d job errors, %d I/Os\n%s", err, res.Errors(), res.IOs(), stderr)
	}
	t.Logf("fio across kill -9 and recover: %d I/Os, 0 errors", res.IOs())
}

func TestLabCLIDelUnderLoadFailsIO(t *testing.T) {
	c := newLabCLI(t)
	dev := c.must("ublk", "add", "null", "--size", "1G", "--queues", "2")
	fio := startFio(t, []string{"--name=load", "--filename=" + dev, "--ioengine=io_uring", "--direct=1",
		"--rw=randread", "--bs=4k", "--iodepth=32", "--time_based", "--runtime=60"})
	time.Sleep(2 * time.Second)
	if !fio.running() {
		t.Fatal("fio ended before the device was deleted")
	}
	c.must("ublk", "del", dev)
	_, _, err := fio.wait(t, 30*time.Second)
	if err == nil {
		t.Error("fio succeeded although its device was deleted under it")
	}
	if _, serr := os.Stat(dev); !os.IsNotExist(serr) {
		t.Errorf("%s still exists", dev)
	}
	t.Logf("fio after del: %v", err)
}

// A device whose server died can still be deleted: it does not linger.
func TestLabCLIDelAfterServerDied(t *testing.T) {
	c := newLabCLI(t)
	dev := c.must("ublk", "add", "null", "--size", "1G")
	e := c.entry(dev)
	if e == nil {
		t.Fatal("device not listed")
	}
	syscall.Kill(int(e.PID), syscall.SIGKILL)
	if !labtest.WaitFor(15*time.Second, func() bool {
		n := c.entry(dev)
		return n != nil && n.State == "quiesced"
	}) {
		t.Fatalf("device did not become quiesced: %+v", c.entry(dev))
	}
	c.must("ublk", "del", dev)
	if c.entry(dev) != nil {
		t.Fatal("device still listed after del")
	}
	if _, err := os.Stat(filepath.Join(c.runDir, "ublk", strings.TrimPrefix(dev, "/dev/ublkb")+".json")); !os.IsNotExist(err) {
		t.Errorf("record of the deleted device is left behind: %v", err)
	}
}
