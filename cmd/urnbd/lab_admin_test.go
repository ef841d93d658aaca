package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/labtest"
)

// The server's ABI under load, over RDMA: per-path stats/rdma count the
// requests fio made (after reset-stats; fio's 4k direct requests are not
// merged: its byte counts, plus each request's 32-byte RNBD message,
// matched them too); `server session disconnect` under
// fio verify makes the client reconnect and lose nothing; `server device
// close` under fio makes the client's I/O on the device fail, not hang,
// as the kernel's force_close does.
func TestLabServerAdminUnderFio(t *testing.T) {
	c := newLabCLI(t)
	provisionRDMA(t)
	dev := c.mapOverTwoRDMAPaths(t, "adm", 1262)
	paths := func() []pathEntry {
		var ps []pathEntry
		out := c.must("server", "path", "list", "--format", "json", "adm")
		if err := json.Unmarshal([]byte(out), &ps); err != nil || len(ps) != 2 {
			t.Fatalf("server path list: %v\n%s", err, out)
		}
		return ps
	}
	for _, p := range paths() {
		c.must("server", "path", "reset-stats", "adm", p.Name)
	}
	pinnedFio(t, dev, "randwrite", "4M", 0)
	pinnedFio(t, dev, "randread", "8M", 1)
	var reads, writes, rb, wb uint64
	for _, p := range paths() {
		var rc, r, wc, w uint64
		if _, err := fmt.Sscan(p.Rdma, &rc, &r, &wc, &w); err != nil {
			t.Fatalf("path %s: stats/rdma %q: %v", p.Name, p.Rdma, err)
		}
		reads, writes, rb, wb = reads+rc, writes+wc, rb+r, wb+w
	}
	t.Logf("server stats/rdma over both paths: %d reads (%d bytes), %d writes (%d bytes)", reads, rb, writes, wb)
	if reads != (8<<20)/4096 || writes != (4<<20)/4096 {
		t.Errorf("server stats/rdma: %d reads, %d writes; fio made %d and %d", reads, writes, (8<<20)/4096, (4<<20)/4096)
	}

	// Session disconnect under fio verify: reconnected, nothing lost.
	verify := make(chan error, 1)
	go func() {
		res, stderr, err := labtest.Fio(t, labtest.VerifyArgs(dev, "32M")...)
		if err == nil && res.Errors() != 0 {
			err = fmt.Errorf("%d fio jobs failed: %s", res.Errors(), stderr)
		}
		verify <- err
	}()
	time.Sleep(2 * time.Second)
	c.must("server", "session", "disconnect", "adm")
	select {
	case err := <-verify:
		if err != nil {
			t.Errorf("fio verify across a server session disconnect: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("fio verify did not end after a server session disconnect")
	}

	// Device close under fio: its I/O fails, and fio ends.
	var devs []deviceEntry
	if err := json.Unmarshal([]byte(c.must("server", "device", "list", "--format", "json")), &devs); err != nil || len(devs) != 1 {
		t.Fatalf("server device list: %v %+v", err, devs)
	}
	load := make(chan error, 1)
	go func() {
		res, _, err := labtest.Fio(t, "--name=io", "--filename="+dev, "--rw=randread", "--bs=4k", "--direct=1",
			"--ioengine=libaio", "--iodepth=16", "--time_based", "--runtime=60")
		if err == nil && res.Errors() == 0 {
			err = fmt.Errorf("no error")
		} else {
			err = nil
		}
		load <- err
	}()
	time.Sleep(2 * time.Second)
	if out := c.must("server", "device", "close", devs[0].Device); out != "1 mappings closed" {
		t.Errorf("server device close: %q", out)
	}
	select {
	case err := <-load:
		if err != nil {
			t.Errorf("fio after server device close: %v; want its I/O to fail", err)
		}
	case <-time.After(50 * time.Second):
		t.Fatal("fio went on for 50 s after server device close: the client's I/O did not fail")
	}
}
