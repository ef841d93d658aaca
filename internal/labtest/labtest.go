// Package labtest has helpers for tests that need a real kernel facility
// (ublk, RDMA) and run inside the qemu lab (tools/lab), or on any host that
// has the facility.
//
// Inside the lab, URNBD_LAB=1 is set: a missing facility then fails the
// test instead of skipping it, so a lab run cannot pass by skipping.
package labtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// InLab reports whether the test runs inside the lab VM.
func InLab() bool { return os.Getenv("URNBD_LAB") == "1" }

// Need skips t (or fails it, in the lab) unless path exists.
func Need(t testing.TB, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		return
	}
	if InLab() {
		t.Fatalf("in the lab but %s is missing (%s)", path, what)
	}
	t.Skipf("needs %s (%s), which this host lacks; it runs in the lab: make lab-test", path, what)
}

// NeedUblk requires the ublk driver.
func NeedUblk(t testing.TB) { Need(t, "/dev/ublk-control", "ublk_drv") }

// NeedCommand requires an executable on PATH.
func NeedCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if InLab() {
			t.Fatalf("in the lab but %s is not installed", name)
		}
		t.Skipf("needs %s, which is not installed here", name)
	}
	return p
}

// Run runs a command and fails t with its output if it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// FioResult is the part of fio's JSON output that tests check.
type FioResult struct {
	Jobs []struct {
		Name  string `json:"jobname"`
		Error int    `json:"error"`
		Read  FioDir `json:"read"`
		Write FioDir `json:"write"`
	} `json:"jobs"`
}

// FioDir is one direction of a fio job's result.
type FioDir struct {
	IOs      int64   `json:"total_ios"`
	Bytes    int64   `json:"io_bytes"`
	IOPS     float64 `json:"iops"`
	BWKiB    int64   `json:"bw"`
	ShortIOs int64   `json:"short_ios"`
	DropIOs  int64   `json:"drop_ios"`
}

// Errors returns the sum of the jobs' error codes.
func (r *FioResult) Errors() int {
	n := 0
	for _, j := range r.Jobs {
		if j.Error != 0 {
			n++
		}
	}
	return n
}

// IOs returns the I/Os done by all jobs, reads and writes.
func (r *FioResult) IOs() int64 {
	var n int64
	for _, j := range r.Jobs {
		n += j.Read.IOs + j.Write.IOs
	}
	return n
}

// IOPS returns the summed IOPS of all jobs, reads and writes.
func (r *FioResult) IOPS() float64 {
	var n float64
	for _, j := range r.Jobs {
		n += j.Read.IOPS + j.Write.IOPS
	}
	return n
}

// Fio runs fio with args (and JSON output) and returns its result and
// error; the caller decides what a failure means.
func Fio(t testing.TB, args ...string) (*FioResult, string, error) {
	t.Helper()
	NeedCommand(t, "fio")
	cmd := exec.Command("fio", append([]string{"--output-format=json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var res FioResult
	out := stdout.Bytes()
	// fio prints notices before the JSON document at times.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil && err == nil {
		err = fmt.Errorf("parse fio output: %v", jerr)
	}
	return &res, stderr.String(), err
}

// VerifyArgs are the fio arguments of the data-integrity workload: randrw,
// 4k–1M blocks (40 % 4k, then 16k, 64k, 256k and 1M; the block layer
// splits what exceeds the device's max transfer), crc32c verify, iodepth
// 64, two jobs on disjoint halves.
func VerifyArgs(dev string, sizePerJob string) []string {
	return []string{
		"--name=verify", "--filename=" + dev, "--ioengine=io_uring", "--direct=1",
		"--rw=randrw", "--bssplit=4k/40:16k/20:64k/20:256k/10:1m/10", "--iodepth=64", "--numjobs=2",
		"--size=" + sizePerJob, "--offset_increment=" + sizePerJob,
		"--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--verify_state_save=0",
	}
}

// Binary returns the urnbd binary to test: $URNBD_BIN, or one built from
// the module into a temporary directory.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("URNBD_BIN"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(t.TempDir(), "urnbd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/urnbd")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build urnbd: %v\n%s", err, b)
	}
	return out
}

// WaitFor polls cond every 20ms until it holds or timeout passes.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SparseFile creates a sparse file of size bytes in a temporary directory
// of t and returns its path.
func SparseFile(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}
