package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/keyfile"
	"github.com/urnbd/urnbd/internal/labtest"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
)

// A server with --auth-keys, from the command line, on loopback: a client
// without a key and one with another key are refused with EACCES, the
// one with the key maps, and the session shows the key as its identity;
// bad key files stop the server with a clear error.
func TestServerAuthKeys(t *testing.T) {
	bin := labtest.Binary(t)
	dir := t.TempDir()
	run := func(args ...string) (string, int) {
		c := exec.Command(bin, args...)
		c.Env = append(os.Environ(), "URNBD_RUN_DIR="+dir)
		out, err := c.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	srvKeys, cliKey, other := filepath.Join(dir, "server.keys"), filepath.Join(dir, "alice.key"), filepath.Join(dir, "other.key")
	for _, k := range [][2]string{{"alice", cliKey}, {"alice", other}} {
		if out, rc := run("key", "generate", "--out", k[1], k[0]); rc != 0 {
			t.Fatalf("key generate: %d %s", rc, out)
		}
	}
	line, _ := os.ReadFile(cliKey)
	if err := os.WriteFile(srvKeys, append([]byte("# the keys clients may prove\n"), line...), 0o600); err != nil {
		t.Fatal(err)
	}

	// Bad key files and flags stop the server before it listens.
	open, _ := os.CreateTemp(dir, "open")
	open.Write(line)
	open.Close()
	os.Chmod(open.Name(), 0o644)
	port := strconv.Itoa(freeTCPPort(t))
	metrics := "127.0.0.1:" + strconv.Itoa(freeTCPPort(t))
	base := []string{"server", "--listen", "tcp://127.0.0.1:" + port, "--memory", "m0=1M", "--admin-socket", filepath.Join(dir, "adm.sock"), "--metrics-listen", metrics}
	if out, rc := run(append(base, "--auth-keys", open.Name())...); rc == 0 || !strings.Contains(out, "chmod 600") {
		t.Errorf("world-readable key file: status %d, %s", rc, out)
	}
	if out, rc := run(append(base, "--auth-optional")...); rc != 2 {
		t.Errorf("--auth-optional without keys: status %d, %s; want 2", rc, out)
	}

	srv := exec.Command(bin, append(base, "--auth-keys", srvKeys)...)
	srv.Env = append(os.Environ(), "URNBD_RUN_DIR="+dir)
	log := startLoggedServer(t, srv, dir)
	dial := func(name, keyFile string) (*rnbd.Client, error) {
		cfg := rtrs.ClientConfig{SessName: name, Paths: []rtrs.PathAddr{{Dst: "127.0.0.1:" + port}}, MaxReconnectAttempts: 0}
		if keyFile != "" {
			k, err := keyfile.ReadOne(keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Key = k
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return rnbd.DialTCP(ctx, cfg)
	}
	var c *rnbd.Client
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err = dial("alice1", cliKey); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keyed client: %v; server log:\n%s", err, log.String())
		}
	}
	defer c.Close()
	if _, err := dial("anon", ""); !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "requires authentication") {
		t.Errorf("client without a key: %v, want EACCES", err)
	}
	if _, err := dial("forged", other); !errors.Is(err, syscall.EACCES) {
		t.Errorf("client with another secret for alice: %v, want EACCES", err)
	}
	if out, rc := run("server", "session", "show", "--admin-socket", filepath.Join(dir, "adm.sock"), "alice1"); rc != 0 || !regexp.MustCompile(`identity:\s+alice\n`).MatchString(out) {
		t.Errorf("session show: status %d\n%s", rc, out)
	}
	if body := httpGet(t, "http://"+metrics+"/metrics"); !strings.Contains(body, `urnbd_server_session_identity{sess="alice1",key="alice",certificate=""} 1`) {
		t.Errorf("/metrics has no identity of session alice1:\n%s", body)
	}
	if !strings.Contains(log.String(), "refused: the client does not authenticate") {
		t.Errorf("no audit line for the client without a key:\n%s", log.String())
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
