package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/urnbd/urnbd/internal/clientd"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/labtest"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"4096": 4096, "512K": 512 << 10, "1G": 1 << 30, "1g": 1 << 30, "2MiB": 2 << 20, "1.5K": 1536, "1T": 1 << 40,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1Q", "1e30G"} {
		if _, err := parseSize(in); !errors.Is(err, unix.EINVAL) {
			t.Errorf("parseSize(%q) = %v, want EINVAL", in, err)
		}
	}
}

func TestParseID(t *testing.T) {
	for in, want := range map[string]uint32{"0": 0, "12": 12, "/dev/ublkb3": 3, "ublkb7": 7} {
		if got, err := parseID(in); err != nil || got != want {
			t.Errorf("parseID(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "/dev/sda", "-1"} {
		if _, err := parseID(in); !errors.Is(err, unix.EINVAL) {
			t.Errorf("parseID(%q) = %v, want EINVAL", in, err)
		}
	}
}

func TestExitCodeCarriesErrno(t *testing.T) {
	if got := exitCode(&clientd.Error{Msg: "x", Errno: unix.ENOENT}); got != 2 {
		t.Errorf("exit code = %d, want 2", got)
	}
	if got := exitCode(errors.New("plain")); got != 1 {
		t.Errorf("exit code = %d, want 1", got)
	}
}

// On a host without ublk_drv, every ublk command says so and how to fix it.
func TestNoDriverMessage(t *testing.T) {
	if _, err := os.Stat("/dev/ublk-control"); err == nil {
		t.Skip("this host has ublk_drv; the no-driver message cannot be seen here")
	}
	out, err := exec.Command(labtest.Binary(t), "ublk", "list").CombinedOutput()
	if err == nil {
		t.Fatalf("ublk list succeeded without a driver:\n%s", out)
	}
	if !strings.Contains(string(out), "modprobe ublk_drv") {
		t.Errorf("message does not say how to load the driver:\n%s", out)
	}
}
