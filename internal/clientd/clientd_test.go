package clientd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/internal/rnbdtest"
	"github.com/urnbd/urnbd/rnbd"
)

func TestRecords(t *testing.T) {
	r := Records{Dir: filepath.Join(t.TempDir(), "rnbd")}
	if r.Any() || len(r.IDs()) != 0 {
		t.Fatal("records in an empty folder")
	}
	spec, err := ParseMapString([]string{"sessname=s path=ip:192.0.2.2 device_path=a.img access_mode=ro transport=rdma"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &Record{Spec: *spec, Queues: 3, SessionDevices: 4}
	for _, id := range []uint32{7, 12} {
		if err := r.Save(id, rec); err != nil {
			t.Fatal(err)
		}
	}
	if ids := r.IDs(); !r.Any() || len(ids) != 2 {
		t.Fatalf("IDs %v after two saves", ids)
	}
	got, err := r.Load(12)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.SessName != "s" || got.Spec.Mode != rnbd.AccessRO || got.Queues != 3 || got.SessionDevices != 4 || got.Spec.Paths[0] != spec.Paths[0] {
		t.Errorf("loaded %+v, saved %+v", got, rec)
	}
	if fi, err := os.Stat(r.path(12)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file: %v, mode %v; want 0600", err, fi.Mode())
	}
	// A torn or hand-edited record is an error that names the file, not a
	// mapping with garbage in it.
	os.WriteFile(r.path(7), []byte(`{"spec":{"sessname":"s","access_mode":"rwx"}}`), 0o600)
	if _, err := r.Load(7); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("bad access mode: %v, want EINVAL", err)
	}
	os.WriteFile(r.path(7), []byte(`{"spec":`), 0o600)
	if _, err := r.Load(7); err == nil || !strings.Contains(err.Error(), "7.json") {
		t.Errorf("truncated record: %v, want an error naming the file", err)
	}
	os.WriteFile(filepath.Join(r.Dir, "notanid.json"), nil, 0o600)
	if err := r.Remove(7); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(7); err != nil {
		t.Errorf("removing a record twice: %v", err)
	}
	if ids := r.IDs(); len(ids) != 1 || ids[0] != 12 {
		t.Errorf("IDs %v, want [12]", ids)
	}
}

// serveOn runs Serve for every connection on a unix socket in a temporary
// folder.
func serveOn(t *testing.T, handle func(*Request) (*Reply, error)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "client.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go Serve(c, handle)
		}
	}()
	return sock
}

func TestProtocol(t *testing.T) {
	sock := serveOn(t, func(r *Request) (*Reply, error) {
		switch r.Op {
		case "map":
			return &Reply{Device: "/dev/ublkb" + strconv.Itoa(r.Depth)}, nil
		case "unmap":
			return nil, errors.New("unmap: not mapped: " + syscall.ENOENT.Error())
		}
		return nil, &os.PathError{Op: "op " + r.Op, Err: syscall.EBUSY}
	})
	rep, err := Ask(sock, &Request{Op: "map", Depth: 3, Spec: &MapSpec{SessName: "s"}})
	if err != nil || rep.Device != "/dev/ublkb3" {
		t.Fatalf("map: %+v, %v", rep, err)
	}
	_, err = Ask(sock, &Request{Op: "busy"})
	var de *Error
	if !errors.As(err, &de) || !errors.Is(err, syscall.EBUSY) {
		t.Errorf("a reported error: %v (%T); want a *Error wrapping EBUSY", err, err)
	}
	// An error without an errno carries none.
	if _, err := Ask(sock, &Request{Op: "unmap"}); !errors.As(err, &de) || de.Errno != 0 || errors.Unwrap(err) != nil {
		t.Errorf("an error without errno: %v", err)
	}
	// Garbage on the socket gets EINVAL, not a hang or a crash.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("{not json\n"))
	c.(*net.UnixConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	c.Close()
	if !strings.Contains(string(buf[:n]), `"errno":22`) {
		t.Errorf("bad request answered %q, want errno 22", buf[:n])
	}
	// No daemon: the dial error says so (ENOENT), which the CLI uses to
	// start one.
	if _, err := Ask(filepath.Join(t.TempDir(), "none.sock"), &Request{Op: "list"}); !errors.Is(err, ErrNoDaemon) || !errors.Is(err, syscall.ENOENT) || errors.As(err, &de) {
		t.Errorf("no daemon: %v, want ErrNoDaemon and ENOENT from the dial", err)
	}
}

func TestFits(t *testing.T) {
	s := Session{Spec: MapSpec{SessName: "s", Transport: "rdma"}, Queues: 2, MaxDevices: 8}
	spec := MapSpec{SessName: "s"}
	if err := s.Fits(&spec, 0, 0); err != nil || spec.Transport != "rdma" {
		t.Errorf("a request naming nothing: %v, transport %q; want it to fit, rdma filled in", err, spec.Transport)
	}
	for _, bad := range []struct {
		spec            MapSpec
		queues, devices int
	}{{MapSpec{Transport: "tcp"}, 0, 0}, {MapSpec{}, 3, 0}, {MapSpec{}, 0, 4}} {
		if err := s.Fits(&bad.spec, bad.queues, bad.devices); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%+v: %v, want EINVAL", bad, err)
		}
	}
	if err := s.Fits(&MapSpec{Transport: "rdma"}, 2, 8); err != nil {
		t.Errorf("the session's own settings: %v", err)
	}
}

func TestDial(t *testing.T) {
	ctx := context.Background()
	if _, err := Dial(ctx, &MapSpec{SessName: "s"}, 0, 0); !errors.Is(err, syscall.ENXIO) {
		t.Errorf("no paths: %v, want ENXIO", err)
	}
	if _, err := Dial(ctx, &MapSpec{SessName: "s", Paths: []MapPath{{Dst: "127.0.0.1", Port: 1}}, Transport: "udp"}, 0, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("transport udp: %v, want EINVAL", err)
	}
	// A real RNBD server on loopback: the session opens over TCP, the
	// default transport, with what the request asked for.
	spec := loopbackSpec(t, "clientd", "a.img")
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := Dial(dctx, spec, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if spec.Transport != DefaultTransport || c.Queues() != 2 || c.MaxDevices() != 3 {
		t.Errorf("session: transport %q, %d queues, %d devices; want %s, 2, 3", spec.Transport, c.Queues(), c.MaxDevices(), DefaultTransport)
	}
	if ps := c.Paths(); len(ps) != 1 || ps[0].State != "connected" {
		t.Errorf("paths %+v", ps)
	}
}

// loopbackSpec starts an RNBD server over TCP on loopback, exporting an
// empty folder, and returns a map request for device dev of session sess
// on it.
func loopbackSpec(t *testing.T, sess, dev string) *MapSpec {
	t.Helper()
	_, port, err := net.SplitHostPort(rnbdtest.ServeTCP(t, rnbd.ServerConfig{DevSearchPath: t.TempDir()}))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ParseMapString([]string{"sessname=" + sess + " dest_port=" + port + " path=ip:127.0.0.1@ip:127.0.0.1 device_path=" + dev})
	if err != nil {
		t.Fatal(err)
	}
	return spec
}
