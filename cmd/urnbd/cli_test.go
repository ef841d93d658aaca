package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urnbd/urnbd/internal/clientd"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/ublk"

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
	// map starts the client daemon, which stops at once: the command
	// itself says why and exits with the daemon's errno, ENODEV.
	cmd := exec.Command(labtest.Binary(t), "map", "sessname=nodrv", "path=ip:127.0.0.1", "device_path=a.img")
	cmd.Env = append(os.Environ(), "URNBD_RUN_DIR="+t.TempDir())
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != int(unix.ENODEV) {
		t.Errorf("map without a driver: %v, want exit status ENODEV (%d); output:\n%s", err, unix.ENODEV, out)
	}
	if !strings.Contains(string(out), "client daemon did not start: ublk driver not available") || !strings.Contains(string(out), "modprobe ublk_drv") {
		t.Errorf("map without a driver does not say why at the prompt:\n%s", out)
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

// The server's admin socket, from the command line, on loopback: a
// session's path as `urnbd server session|path` show it (text and JSON),
// its disconnect (the client reconnects), the errors for what is not
// there, and the socket is root's only.
func TestServerAdminCommands(t *testing.T) {
	bin := labtest.Binary(t)
	run := t.TempDir()
	port, metrics := freeTCPPort(t), "127.0.0.1:"+strconv.Itoa(freeTCPPort(t))
	srv := exec.Command(bin, "server", "--listen", "tcp://127.0.0.1:"+strconv.Itoa(port), "--memory", "m0=1M", "--metrics-listen", metrics)
	srv.Env = append(os.Environ(), "URNBD_RUN_DIR="+run)
	logf, err := os.Create(filepath.Join(run, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	srv.Stderr = logf // a file, not a buffer: the test reads it while the server writes
	log := serverLog(logf.Name())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	cli := func(args ...string) (string, error) {
		c := exec.Command(bin, append([]string{"server"}, args...)...)
		c.Env = append(os.Environ(), "URNBD_RUN_DIR="+run)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := cli("session", "list"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admin socket never answered; server log:\n%s", log.String())
		}
	}
	if st, err := os.Stat(filepath.Join(run, "server.sock")); err != nil || st.Mode().Perm()&0o077 != 0 {
		t.Errorf("admin socket: %v, mode %v; want root's only", err, st.Mode())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rnbd.DialTCP(ctx, rtrs.ClientConfig{SessName: "adm1", Paths: []rtrs.PathAddr{{Dst: "127.0.0.1:" + strconv.Itoa(port)}}, MaxReconnectAttempts: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	out, err := cli("session", "list")
	if err != nil || !strings.Contains(out, "adm1") || !strings.Contains(out, "connected") {
		t.Errorf("session list: %v\n%s", err, out)
	}
	out, err = cli("path", "list", "--json", "adm1")
	var paths []pathEntry
	if err != nil || json.Unmarshal([]byte(out), &paths) != nil || len(paths) != 1 {
		t.Fatalf("path list --json: %v\n%s", err, out)
	}
	p := paths[0]
	if p.Session != "adm1" || p.Name != "127.0.0.1@127.0.0.1" || p.State != "connected" || p.Transport != "tcp" || p.SrcAddr != "127.0.0.1" {
		t.Errorf("path: %+v", p)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `urnbd_server_session_paths{sess="adm1"} 1`) || !strings.Contains(string(body), `urnbd_server_session_devices{sess="adm1"} 0`) {
		t.Errorf("/metrics:\n%s", body)
	}
	if out, err := cli("path", "show", "adm1", p.Name); err != nil || !strings.Contains(out, "src_addr:") || !strings.Contains(out, "connected") {
		t.Errorf("path show: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"session", "show", "nosuch"}, {"path", "show", "adm1", "10.1.1.1@127.0.0.1"},
		{"path", "disconnect", "nosuch", "0"}, {"device", "close", "m0"}, {"device", "show", "m0"}} {
		out, err := cli(args...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != int(unix.ENOENT) {
			t.Errorf("server %s: %v, want ENOENT\n%s", strings.Join(args, " "), err, out)
		}
	}
	if out, err := cli("path", "disconnect", "adm1", p.Name); err != nil {
		t.Fatalf("path disconnect: %v\n%s", err, out)
	}
	// The client reconnects the path: it is CONNECTED again, a new one.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _ := cli("path", "list", "--json", "adm1")
		var now []pathEntry
		if json.Unmarshal([]byte(out), &now) == nil && len(now) == 1 && now[0].State == "connected" &&
			strings.Contains(log.String(), "admin: disconnect path") && c.Paths()[0].State == "connected" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the path did not come back: %s; server log:\n%s", out, log.String())
		}
	}
	if !strings.Contains(log.String(), `admin: disconnect path "127.0.0.1@127.0.0.1" of session "adm1"`) {
		t.Errorf("the server logged no disconnect:\n%s", log.String())
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startLoggedServer starts the server command srv with its standard error
// in dir/server.log, stops it when the test ends, and waits until it
// listens; it returns its log.
func startLoggedServer(t *testing.T, srv *exec.Cmd, dir string) serverLog {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	srv.Stderr = logf // a file, not a buffer: the test reads it while the server writes
	log := serverLog(logf.Name())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	if !labtest.WaitFor(10*time.Second, func() bool { return strings.Contains(log.String(), "listening on") }) {
		t.Fatalf("server did not start:\n%s", log.String())
	}
	return log
}

// serverLog is a server's log file; String reads it as it is now.
type serverLog string

func (l serverLog) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
}

// --config: a file that does not parse stops the server before it
// listens (EINVAL, naming the rule); SIGHUP reads it again, and a broken
// file then keeps the rules in force and the server running.
func TestServerConfigFile(t *testing.T) {
	bin := labtest.Binary(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "server.toml")
	os.WriteFile(conf, []byte("[[allow]]\nclients = [\"127.0.0.1/40\"]\naccess = \"rw\"\n"), 0o600)
	srvArgs := []string{"server", "--listen", "tcp://127.0.0.1:" + strconv.Itoa(freeTCPPort(t)), "--memory", "m0=1M", "--config", conf}
	cmd := exec.Command(bin, srvArgs...)
	cmd.Env = append(os.Environ(), "URNBD_RUN_DIR="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != int(unix.EINVAL) || !strings.Contains(string(out), "rule 1: clients") {
		t.Fatalf("a bad config: %v, want EINVAL naming the rule; output:\n%s", err, out)
	}
	os.WriteFile(conf, []byte("[[allow]]\nclients = [\"127.0.0.1\"]\nexports = [\"m0\"]\naccess = \"ro\"\n"), 0o600)
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	log := serverLog(logf.Name())
	srv := exec.Command(bin, srvArgs...)
	srv.Env, srv.Stderr = cmd.Env, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	waitLog := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), what); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the server never logged %q:\n%s", what, log.String())
			}
		}
	}
	waitLog("listening on tcp://")
	srv.Process.Signal(syscall.SIGHUP)
	waitLog("read again; 0 mappings it refuses closed")
	os.WriteFile(conf, []byte("[[allow]]\naccess = \"everything\"\n"), 0o600)
	srv.Process.Signal(syscall.SIGHUP)
	waitLog("the rules in force stay")
	if err := srv.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the server stopped on a broken config: %v", err)
	}
}

// urnbd --version and urnbd version --json say the build, the protocol
// versions, and the ublk features used; on a host without ublk_drv the
// kernel's features are none, with why.
func TestVersion(t *testing.T) {
	bin := labtest.Binary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	rnbdVer := fmt.Sprintf("%d.%d", rnbd.ProtoVerMajor, rnbd.ProtoVerMinor)
	if err != nil || !strings.HasPrefix(string(out), "urnbd ") || !strings.Contains(string(out), "protocols: RTRS 2.0, RNBD "+rnbdVer) {
		t.Errorf("--version: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "version", "--json").Output()
	var v versionInfo
	if err != nil || json.Unmarshal(out, &v) != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	if v.Version == "" || !strings.HasPrefix(v.Go, "go1.") || v.RTRS != "2.0" || v.RNBD != rnbdVer || rnbdVer != "2.2" || len(v.UblkUsed) == 0 {
		t.Errorf("version --json: %+v", v)
	}
	if _, err := os.Stat(ublk.ControlPath); err != nil && (v.UblkKernel != nil || !strings.Contains(v.UblkError, "modprobe ublk_drv")) {
		t.Errorf("without ublk_drv: kernel features %v, error %q", v.UblkKernel, v.UblkError)
	} else if err == nil && len(v.UblkKernel) == 0 {
		t.Errorf("with ublk_drv: no kernel features (%q)", v.UblkError)
	}
}
