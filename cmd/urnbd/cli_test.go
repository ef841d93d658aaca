package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
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

// commandPaths lists every command of the tree below cmds as the words
// that run it, with whether it takes arguments of its own.
func commandPaths(prefix []string, cmds []*cli.Command) (paths [][]string, takesArgs []bool) {
	for _, cmd := range cmds {
		p := append(append([]string(nil), prefix...), cmd.Name)
		paths, takesArgs = append(paths, p), append(takesArgs, cmd.ArgsUsage != "")
		sp, st := commandPaths(p, cmd.Subcommands)
		paths, takesArgs = append(paths, sp...), append(takesArgs, st...)
	}
	return paths, takesArgs
}

// Every command refuses an argument it does not take, and a group an
// unknown command, with its usage and exit status 2, before doing
// anything (`urnbd server session list` once started a server on all
// addresses).
func TestStrayArgumentsRefused(t *testing.T) {
	bin := labtest.Binary(t)
	paths, takesArgs := commandPaths(nil, newApp().Commands)
	for i, p := range paths {
		if takesArgs[i] {
			continue // it checks its own: see TestWrongArgumentCounts
		}
		args := append(append([]string(nil), p...), "stray")
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != usageExit {
			t.Errorf("urnbd %s: %v, want exit status %d; output:\n%s", strings.Join(args, " "), err, usageExit, out)
			continue
		}
		if !strings.Contains(string(out), `"stray"`) || !strings.Contains(string(out), "urnbd "+strings.Join(p, " ")+" --help") {
			t.Errorf("urnbd %s: the message names neither the argument nor the command's help:\n%s", strings.Join(args, " "), out)
		}
	}
	for _, args := range [][]string{{"bogus"}, {"server", "--bogus"}, {"ublk", "features", "--json=maybe"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != usageExit {
			t.Errorf("urnbd %s: %v, want exit status %d; output:\n%s", strings.Join(args, " "), err, usageExit, out)
		}
	}
}

// Commands that take arguments refuse a wrong count of them with EINVAL
// and say what they want.
func TestWrongArgumentCounts(t *testing.T) {
	bin := labtest.Binary(t)
	for _, args := range [][]string{{"unmap"}, {"unmap", "0", "1"}, {"path", "add", "s"}, {"path", "add", "s", "ip:127.0.0.1", "x"}, {"session", "set", "mp-policy", "s"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != int(unix.EINVAL) {
			t.Errorf("urnbd %s: %v, want exit status EINVAL; output:\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The server exports nothing and listens nowhere unless told: without
// --listen, or without --dev-search-path or --memory, it says what to
// pass and exits 2; an address with no host is refused too.
func TestServerNeedsListenAndExports(t *testing.T) {
	bin := labtest.Binary(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"server"}, "no --listen"},
		{[]string{"server", "--dev-search-path", dir}, "no --listen"},
		{[]string{"server", "--listen", "tcp://127.0.0.1:0"}, "nothing to export"},
		{[]string{"server", "--listen", "tcp://127.0.0.1:0", "--dev-search-path", ""}, "nothing to export"},
		{[]string{"server", "--listen", "tcp://:0", "--dev-search-path", dir}, "no address"},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != usageExit || !strings.Contains(string(out), tc.want) {
			t.Errorf("urnbd %s: %v; want exit status %d and %q; output:\n%s", strings.Join(tc.args, " "), err, usageExit, tc.want, out)
		}
	}
}
