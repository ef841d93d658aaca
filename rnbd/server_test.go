package rnbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// testServer runs an RNBD server over RTRS/TCP on loopback, exporting dir.
func testServer(t *testing.T, dir string) string {
	t.Helper()
	return testServerConfig(t, ServerConfig{DevSearchPath: dir, MaxIOSize: 126976, Logf: t.Logf})
}

func testServerConfig(t *testing.T, cfg ServerConfig) string {
	t.Helper()
	addr, _, _ := serveTCPTest(t, cfg)
	return addr
}

// serveTCPTest is testServerConfig that also returns the server and its
// session table.
func serveTCPTest(t *testing.T, cfg ServerConfig) (string, *Server, *rtrs.ServerTable) {
	t.Helper()
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tab := rtrs.NewServerTable(rtrs.ServerTableConfig{Linger: testLinger, OnRelease: srv.ReleaseSession, Logf: cfg.Logf})
	rs, err := tcp.NewServer(tcp.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 64, Sessions: tab}, Handler: srv})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go rs.Serve(ln)
	t.Cleanup(func() {
		rs.Close()
		tab.Close()
		tab.Wait()
	})
	return ln.Addr().String(), srv, tab
}

// testLinger is how long the test servers keep a session without paths.
const testLinger = 200 * time.Millisecond

// testClient sends RNBD messages one at a time over an RTRS session.
type testClient struct {
	t *testing.T
	q *tcp.ClientQueue
	c *tcp.Client
}

func dialRNBD(t *testing.T, addr, sess string) *testClient {
	t.Helper()
	tc, err := dialRNBDErr(t, addr, sess)
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// tryDialRNBD is dialRNBD that returns nil when the session is refused.
func tryDialRNBD(t *testing.T, addr, sess string) *testClient {
	tc, _ := dialRNBDErr(t, addr, sess)
	return tc
}

func dialRNBDErr(t *testing.T, addr, sess string) (*testClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tcp.DialClient(ctx, tcp.ClientConfig{SessName: sess, Queues: 1, Paths: []tcp.PathAddr{{Dst: addr}},
		Policy: rtrs.MinInflight, MaxReconnectAttempts: -1})
	if err != nil {
		return nil, err
	}
	go c.Queue(0).Run(nil)
	t.Cleanup(func() { c.Close() })
	return &testClient{t: t, q: c.Queue(0), c: c}, nil
}

// close ends the client's session.
func (tc *testClient) close() { tc.c.Close() }

// call sends msg as an RTRS write (write) or read with data, returns errno.
func (tc *testClient) call(msg marshaler, write bool, data []byte) int {
	tc.t.Helper()
	usr := make([]byte, msg.Size())
	if _, err := msg.MarshalTo(usr); err != nil {
		tc.t.Fatal(err)
	}
	return tc.raw(usr, write, data)
}

func (tc *testClient) raw(usr []byte, write bool, data []byte) int {
	done := make(chan int, 1)
	r := &tcp.Request{Write: write, Usr: usr, Data: data, Done: func(_ *tcp.Request, e int) { done <- e }}
	tc.q.Do(func() {
		if err := tc.q.Submit(r); err != nil {
			done <- -int(syscall.EINVAL)
		}
	})
	select {
	case e := <-done:
		return e
	case <-time.After(10 * time.Second):
		tc.t.Fatal("request timed out")
		return 0
	}
}

func (tc *testClient) open(dev string, mode AccessMode) (OpenRsp, int) {
	tc.t.Helper()
	m := Open{AccessMode: mode}
	if err := m.SetDevName(dev); err != nil {
		tc.t.Fatal(err)
	}
	buf := make([]byte, 56)
	var rsp OpenRsp
	errno := tc.call(&m, false, buf)
	if errno == 0 {
		if err := rsp.Unmarshal(buf); err != nil {
			tc.t.Fatal(err)
		}
	}
	return rsp, errno
}

// mustOpen opens dev, failing the test if the server refuses.
func (tc *testClient) mustOpen(dev string, mode AccessMode) OpenRsp {
	tc.t.Helper()
	rsp, e := tc.open(dev, mode)
	if e != 0 {
		tc.t.Fatalf("OPEN %s %s: errno %d", dev, mode, e)
	}
	return rsp
}

func (tc *testClient) io(id uint32, op IOOp, flags uint32, off int64, data []byte, n int) int {
	m := IO{DeviceID: id, Sector: uint64(off >> 9), RW: MakeRW(op, flags), BiSize: uint32(n)}
	return tc.call(&m, !op.RTRSRead(), data)
}

func mkFile(t *testing.T, dir, name string, size int, fill byte) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Repeat([]byte{fill}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServerSessionOpenIO(t *testing.T) {
	dir := t.TempDir()
	path := mkFile(t, dir, "disk.img", 8<<20, 0)
	tc := dialRNBD(t, testServer(t, dir), "sess-a")
	buf := make([]byte, 36)
	if e := tc.call(&SessInfo{Ver: 2}, false, buf); e != 0 {
		t.Fatalf("SESS_INFO: errno %d", e)
	}
	var si SessInfoRsp
	if err := si.Unmarshal(buf); err != nil || si.Ver != 2 {
		t.Fatalf("SESS_INFO_RSP %+v, %v", si, err)
	}
	rsp, e := tc.open("disk.img", AccessRW)
	if e != 0 {
		t.Fatalf("OPEN: errno %d", e)
	}
	if rsp.NSectors != 8<<20>>9 || rsp.LogicalBlockSize != 512 || rsp.DeviceID != 0 || rsp.CachePolicy != CacheWriteback|CacheFUA {
		t.Fatalf("OPEN_RSP %+v", rsp)
	}
	if again, e := tc.open("/disk.img", AccessRW); e != 0 || again.DeviceID != rsp.DeviceID {
		t.Errorf("second open of the same device: id %d errno %d, want the same id", again.DeviceID, e)
	}
	data := bytes.Repeat([]byte("urnbd!!!"), 512) // 4 KiB
	if e := tc.io(0, OpWrite, FlagSync|FlagFUA, 8192, data, len(data)); e != 0 {
		t.Fatalf("WRITE: errno %d", e)
	}
	back := make([]byte, len(data))
	if e := tc.io(0, OpRead, FlagSync, 8192, back, len(back)); e != 0 || !bytes.Equal(back, data) {
		t.Fatalf("READ: errno %d, data equal %v", e, bytes.Equal(back, data))
	}
	onDisk, _ := os.ReadFile(path)
	if !bytes.Equal(onDisk[8192:8192+4096], data) {
		t.Fatal("the backing file does not hold what was written")
	}
	if e := tc.io(0, OpFlush, FlagSync|FlagFUA, 0, nil, 0); e != 0 {
		t.Fatalf("FLUSH: errno %d", e)
	}
	// The kernel's block layer leaves a flush's sector at -1.
	if e := tc.io(0, OpFlush, FlagSync|FlagFUA, -512, nil, 0); e != 0 {
		t.Fatalf("FLUSH without a range: errno %d", e)
	}
	// Discard and write zeroes read back as zeroes.
	for _, op := range []IOOp{OpDiscard, OpWriteZeroes} {
		if e := tc.io(0, OpWrite, 0, 0, data, len(data)); e != 0 {
			t.Fatal(e)
		}
		if e := tc.io(0, op, 0, 0, nil, 4096); e != 0 {
			t.Fatalf("%v: errno %d", op, e)
		}
		if e := tc.io(0, OpRead, 0, 0, back, 4096); e != 0 || !bytes.Equal(back, make([]byte, 4096)) {
			t.Errorf("%v: errno %d, reads back as zeroes: %v", op, e, bytes.Equal(back, make([]byte, 4096)))
		}
	}
	if e := tc.io(0, OpRead, 0, 8<<20, back, 4096); e != -int(syscall.EIO) {
		t.Errorf("read past the end: errno %d, want -EIO", e)
	}
	if e := tc.io(0, OpRead, 0, 0, back, 2048); e != -int(syscall.EINVAL) {
		t.Errorf("bi_size ≠ data length: errno %d, want -EINVAL", e)
	}
	if e := tc.raw([]byte{9, 0, 0, 0}, true, nil); e != -int(syscall.EINVAL) {
		t.Errorf("unknown message type: errno %d, want -EINVAL", e)
	}
	if e := tc.call(&Close{DeviceID: 0}, true, nil); e != 0 {
		t.Fatalf("CLOSE: errno %d", e)
	}
	if e := tc.io(0, OpRead, 0, 0, back, 4096); e != -int(syscall.ENOTCONN) {
		t.Errorf("I/O to a closed device: errno %d, want -ENOTCONN", e)
	}
}

func TestServerAccessModes(t *testing.T) {
	dir := t.TempDir()
	path := mkFile(t, dir, "disk.img", 1<<20, 0xAB)
	addr := testServer(t, dir)
	a, b, c := dialRNBD(t, addr, "sess-a"), dialRNBD(t, addr, "sess-b"), dialRNBD(t, addr, "sess-c")
	if _, e := a.open("disk.img", AccessRW); e != 0 {
		t.Fatalf("first rw: %d", e)
	}
	if _, e := b.open("disk.img", AccessRW); e != -int(syscall.EPERM) {
		t.Errorf("second rw: errno %d, want -EPERM", e)
	}
	if _, e := b.open("disk.img", AccessMigration); e != 0 {
		t.Errorf("migration next to one rw: errno %d, want 0", e)
	}
	if _, e := c.open("disk.img", AccessMigration); e != -int(syscall.EPERM) {
		t.Errorf("third writer (migration): errno %d, want -EPERM", e)
	}
	ro, e := c.open("disk.img", AccessRO)
	if e != 0 {
		t.Fatalf("ro: errno %d", e)
	}
	data := make([]byte, 4096)
	if e := c.io(ro.DeviceID, OpWrite, 0, 0, data, len(data)); e != -int(syscall.EROFS) {
		t.Errorf("write to a read-only mapping: errno %d, want -EROFS", e)
	}
	if e := c.io(ro.DeviceID, OpDiscard, 0, 0, nil, 4096); e != -int(syscall.EROFS) {
		t.Errorf("discard on a read-only mapping: errno %d, want -EROFS", e)
	}
	onDisk, _ := os.ReadFile(path)
	if !bytes.Equal(onDisk[:4096], bytes.Repeat([]byte{0xAB}, 4096)) {
		t.Error("a refused write changed the data")
	}
	// Closing the rw mapping lets another rw in.
	if e := a.call(&Close{DeviceID: 0}, true, nil); e != 0 {
		t.Fatal(e)
	}
	if e := b.call(&Close{DeviceID: 0}, true, nil); e != 0 {
		t.Fatal(e)
	}
	// A repeated open asks for the mode it gets: the same mode answers
	// the same device, another one is refused while the first is open.
	if again, e := c.open("disk.img", AccessRO); e != 0 || again.DeviceID != ro.DeviceID {
		t.Errorf("repeated ro open: device %d, errno %d; want device %d", again.DeviceID, e, ro.DeviceID)
	}
	if _, e := c.open("disk.img", AccessRW); e != -int(syscall.EEXIST) {
		t.Errorf("rw open of a device the session has open ro: errno %d, want -EEXIST", e)
	}
	if e := c.call(&Close{DeviceID: ro.DeviceID}, true, nil); e != 0 {
		t.Fatal(e)
	}
	rw, e := c.open("disk.img", AccessRW)
	if e != 0 {
		t.Fatalf("rw after the writers closed: errno %d", e)
	}
	if e := c.io(rw.DeviceID, OpWrite, 0, 0, data, len(data)); e != 0 {
		t.Errorf("write to the rw mapping: errno %d", e)
	}
}

func TestServerRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "exports")
	os.Mkdir(dir, 0o700)
	mkFile(t, root, "secret.img", 1<<20, 1)
	mkFile(t, dir, "ok.img", 1<<20, 2)
	os.Symlink("../secret.img", filepath.Join(dir, "link-out.img"))
	os.Symlink("ok.img", filepath.Join(dir, "link-in.img"))
	tc := dialRNBD(t, testServer(t, dir), "sess-a")
	for dev, want := range map[string]int{
		"../secret.img":      -int(syscall.EINVAL),
		"a/../../secret.img": -int(syscall.EINVAL),
		"link-out.img":       -int(syscall.EINVAL),
		"missing.img":        -int(syscall.ENOENT),
		"link-in.img":        0,
		"/ok.img":            0,
	} {
		if _, e := tc.open(dev, AccessRO); e != want {
			t.Errorf("open %q: errno %d, want %d", dev, e, want)
		}
	}
}

func TestServerSessNameSearchPath(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "sess-a"), 0o700)
	mkFile(t, filepath.Join(root, "sess-a"), "disk.img", 1<<20, 0)
	srvAddr := func() string {
		srv, _ := NewServer(ServerConfig{DevSearchPath: root + "/%SESSNAME%", MaxIOSize: 126976, Logf: t.Logf})
		rs, _ := tcp.NewServer(tcp.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 64}, Handler: srv})
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		go rs.Serve(ln)
		t.Cleanup(func() { rs.Close() })
		return ln.Addr().String()
	}()
	if _, e := dialRNBD(t, srvAddr, "sess-a").open("disk.img", AccessRO); e != 0 {
		t.Errorf("session sess-a opening its own disk: errno %d", e)
	}
	if _, e := dialRNBD(t, srvAddr, "sess-b").open("disk.img", AccessRO); e != -int(syscall.ENOENT) {
		t.Errorf("session sess-b opening sess-a's disk: errno %d, want -ENOENT", e)
	}
}

// A memory export behaves as a device: zeros at first, data kept across
// sessions, the access rules of files, EROFS on a read-only mapping, out
// of range refused; and it is found by name, not under the search path.
func TestServerMemoryExport(t *testing.T) {
	if _, err := NewServer(ServerConfig{MemoryExports: map[string]uint64{"odd": 1000}}); err == nil {
		t.Error("a memory export of 1000 bytes was accepted")
	}
	addr := testServerConfig(t, ServerConfig{DevSearchPath: t.TempDir(), MaxIOSize: 126976, Logf: t.Logf,
		MemoryExports: map[string]uint64{"mem0": 1 << 30}})
	a := dialRNBD(t, addr, "sess-a")
	rsp, e := a.open("mem0", AccessRW)
	if e != 0 || rsp.NSectors != 1<<30>>9 {
		t.Fatalf("OPEN mem0: errno %d, %+v", e, rsp)
	}
	buf := make([]byte, 8192)
	if e := a.io(rsp.DeviceID, OpRead, FlagSync, 1<<29, buf, len(buf)); e != 0 || !bytes.Equal(buf, make([]byte, 8192)) {
		t.Fatalf("first READ: errno %d, zeros %v", e, bytes.Equal(buf, make([]byte, 8192)))
	}
	data := bytes.Repeat([]byte("memory!!"), 1024)
	if e := a.io(rsp.DeviceID, OpWrite, FlagSync|FlagFUA, 1<<29, data, len(data)); e != 0 {
		t.Fatalf("WRITE: errno %d", e)
	}
	if e := a.io(rsp.DeviceID, OpWrite, 0, 1<<30-4096, data, len(data)); e != -int(syscall.EIO) {
		t.Errorf("WRITE past the end: errno %d, want -EIO", e)
	}
	if _, e := dialRNBD(t, addr, "sess-b").open("mem0", AccessRW); e != -int(syscall.EPERM) {
		t.Errorf("second rw open from another session: errno %d, want -EPERM", e)
	}
	b := dialRNBD(t, addr, "sess-c")
	ro, e := b.open("mem0", AccessRO)
	if e != 0 {
		t.Fatalf("ro OPEN: errno %d", e)
	}
	if e := b.io(ro.DeviceID, OpRead, FlagSync, 1<<29, buf, len(buf)); e != 0 || !bytes.Equal(buf, data) {
		t.Fatalf("READ from another session: errno %d, equal %v", e, bytes.Equal(buf, data))
	}
	if e := b.io(ro.DeviceID, OpWrite, 0, 0, data, len(data)); e != -int(syscall.EROFS) {
		t.Errorf("WRITE on a read-only mapping: errno %d, want -EROFS", e)
	}
	if e := a.io(rsp.DeviceID, OpWriteZeroes, 0, 1<<29, nil, 4096); e != 0 {
		t.Fatalf("WRITE_ZEROES: errno %d", e)
	}
	if e := b.io(ro.DeviceID, OpRead, FlagSync, 1<<29, buf, len(buf)); e != 0 || !bytes.Equal(buf[:4096], make([]byte, 4096)) || !bytes.Equal(buf[4096:], data[4096:]) {
		t.Errorf("after WRITE_ZEROES of the first 4K: errno %d", e)
	}
	if _, e := a.open("../mem0", AccessRO); e == 0 {
		t.Error("\"../mem0\" opened")
	}
}

// A server with no DevSearchPath exports no file of the host, not "/" as
// the kernel's server does by default: only its memory devices open.
func TestServerWithoutSearchPathExportsNoFiles(t *testing.T) {
	addr := testServerConfig(t, ServerConfig{MaxIOSize: 126976, Logf: t.Logf, MemoryExports: map[string]uint64{"mem0": 1 << 20}})
	c := dialRNBD(t, addr, "sess-a")
	for _, dev := range []string{"etc/passwd", "/etc/passwd", "dev/null"} {
		if _, e := c.open(dev, AccessRO); e != -int(syscall.ENOENT) {
			t.Errorf("OPEN %q: errno %d, want -ENOENT", dev, e)
		}
	}
	if _, e := c.open("mem0", AccessRW); e != 0 {
		t.Errorf("OPEN mem0: errno %d", e)
	}
}

// The operator's view of the exports (Exports) shows who has what open
// and how; ForceClose closes one session's mapping, whose I/O then fails,
// and leaves the other session's.
func TestServerExportsAndForceClose(t *testing.T) {
	dir := t.TempDir()
	mkFile(t, dir, "a.img", 1<<20, 0)
	addr, srv, tab := serveTCPTest(t, ServerConfig{DevSearchPath: dir, MaxIOSize: 126976, Logf: t.Logf})
	a, b := dialRNBD(t, addr, "sess-a"), dialRNBD(t, addr, "sess-b")
	ra := a.mustOpen("a.img", AccessMigration)
	rb := b.mustOpen("./a.img", AccessRO)
	ex := srv.Exports()
	if len(ex) != 1 || ex[0].Path != filepath.Join(dir, "a.img") || len(ex[0].Sessions) != 2 {
		t.Fatalf("Exports() = %+v, want a.img open in two sessions", ex)
	}
	if s := ex[0].Sessions[0]; s.Session != "sess-a" || s.AccessMode != AccessMigration || s.ReadOnly || s.MappingPath != "a.img" || s.DeviceID != ra.DeviceID {
		t.Errorf("sess-a's mapping: %+v", s)
	}
	if s := ex[0].Sessions[1]; s.Session != "sess-b" || s.AccessMode != AccessRO || !s.ReadOnly || s.MappingPath != "./a.img" || s.DeviceID != rb.DeviceID {
		t.Errorf("sess-b's mapping: %+v", s)
	}
	if _, err := srv.ForceClose("a.img", "sess-c"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("ForceClose in a session that has nothing open: %v, want ENOENT", err)
	}
	if n, err := srv.ForceClose(filepath.Join(dir, "a.img"), "sess-b"); n != 1 || err != nil {
		t.Fatalf("ForceClose in sess-b: %d, %v", n, err)
	}
	buf := make([]byte, 4096)
	if e := b.io(rb.DeviceID, OpRead, FlagSync, 0, buf, len(buf)); e != -int(syscall.ENOTCONN) {
		t.Errorf("READ on the closed mapping: errno %d, want -ENOTCONN", e)
	}
	if e := a.io(ra.DeviceID, OpRead, FlagSync, 0, buf, len(buf)); e != 0 {
		t.Errorf("READ on the other session's mapping: errno %d", e)
	}
	if ex := srv.Exports(); len(ex) != 1 || len(ex[0].Sessions) != 1 || ex[0].Sessions[0].Session != "sess-a" {
		t.Errorf("Exports() after the close = %+v, want only sess-a's", ex)
	}
	if n, err := srv.ForceClose("a.img", ""); n != 1 || err != nil {
		t.Fatalf("ForceClose in all sessions: %d, %v", n, err)
	}
	if ex := srv.Exports(); len(ex) != 0 {
		t.Errorf("Exports() after closing all = %+v", ex)
	}

	// The session layer's view of the same server: both sessions, one
	// path each, over TCP; a path disconnected by the operator goes.
	st := tab.Status()
	if len(st) != 2 || st[0].Name != "sess-a" || st[1].Name != "sess-b" || len(st[0].Paths) != 1 {
		t.Fatalf("Status() = %+v, want sess-a and sess-b with a path each", st)
	}
	p := st[0].Paths[0]
	if p.State != rtrs.ServerPathConnected || p.Details.Transport != "tcp" || p.Name != rtrs.ServerPathName(p.Src, p.Dst) || p.Name != "127.0.0.1@127.0.0.1" {
		t.Errorf("sess-a's path: %+v", p)
	}
	if err := tab.DisconnectPath("sess-a", "10.0.0.1@127.0.0.1"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("DisconnectPath of no such path: %v, want ENOENT", err)
	}
	if _, err := tab.DisconnectSession("sess-z"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("DisconnectSession of no such session: %v, want ENOENT", err)
	}
	if err := tab.ResetPathStats("sess-a", p.Name); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("ResetPathStats of a TCP path: %v, want EOPNOTSUPP (it keeps no statistics)", err)
	}
	if err := tab.ResetPathStats("sess-a", "7"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("ResetPathStats of no such path: %v, want ENOENT", err)
	}
	if err := tab.DisconnectPath("sess-a", p.Name); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st := tab.Status()
		if len(st) > 0 && st[0].Name == "sess-a" && (len(st[0].Paths) == 0 || st[0].Lingering) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sess-a's path is still there: %+v", st)
		}
	}
	if n, err := tab.DisconnectSession("sess-b"); n != 1 || err != nil {
		t.Errorf("DisconnectSession(sess-b) = %d, %v", n, err)
	}
}

// With a policy an OPEN that no rule allows gets EACCES and an audit line
// with the session, its address, the export and why; a new policy closes
// the mappings it no longer allows and keeps the others.
func TestServerPolicy(t *testing.T) {
	dir := t.TempDir()
	mkFile(t, dir, "a.img", 1<<20, 0)
	mkFile(t, dir, "b.img", 1<<20, 0)
	p, err := ParsePolicy([]byte("[[allow]]\nclients = [\"127.0.0.0/8\"]\nsessions = [\"sess-*\"]\nexports = [\"a.img\", \"b.img\"]\naccess = \"rw\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncLog
	addr, srv, _ := serveTCPTest(t, ServerConfig{DevSearchPath: dir, MaxIOSize: 126976, Logf: logs.logf, Policy: p})
	a, x := dialRNBD(t, addr, "sess-a"), dialRNBD(t, addr, "other")
	ra := a.mustOpen("a.img", AccessRW)
	rb := a.mustOpen("b.img", AccessRW)
	if _, e := a.open("a.img", AccessMigration); e != -int(syscall.EACCES) {
		t.Errorf("OPEN a.img migration: errno %d, want -EACCES", e)
	}
	if _, e := x.open("a.img", AccessRO); e != -int(syscall.EACCES) {
		t.Errorf("OPEN by a session the policy does not name: errno %d, want -EACCES", e)
	}
	if !logs.has(`audit: open refused: session "other" from [127.0.0.1], key none, export "a.img", access mode ro: no policy rule`) {
		t.Errorf("no audit line for the refusal:\n%s", logs.String())
	}
	// The new policy keeps a.img for sess-a and drops b.img.
	p2, err := ParsePolicy([]byte("[[allow]]\nsessions = [\"sess-a\"]\nexports = [\"a.img\"]\naccess = \"rw\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.SetPolicy(p2); n != 1 {
		t.Errorf("SetPolicy closed %d mappings, want 1 (b.img)", n)
	}
	buf := make([]byte, 4096)
	if e := a.io(ra.DeviceID, OpRead, FlagSync, 0, buf, len(buf)); e != 0 {
		t.Errorf("READ a.img after the new policy: errno %d", e)
	}
	if e := a.io(rb.DeviceID, OpRead, FlagSync, 0, buf, len(buf)); e != -int(syscall.ENOTCONN) {
		t.Errorf("READ b.img after the new policy: errno %d, want -ENOTCONN", e)
	}
	if !logs.has(`audit: mapping closed by the new policy: session "sess-a"`) {
		t.Errorf("no audit line for the closed mapping:\n%s", logs.String())
	}
	if n := srv.SetPolicy(nil); n != 0 {
		t.Errorf("SetPolicy(nil) closed %d", n)
	}
	if _, e := x.open("b.img", AccessRO); e != 0 {
		t.Errorf("OPEN without a policy: errno %d", e)
	}
}

// syncLog collects a server's log lines for a test.
type syncLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *syncLog) logf(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *syncLog) has(s string) bool { return strings.Contains(l.String(), s) }

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// The io_uring backend engine (AsyncIO) serves reads, writes with FUA,
// flushes and an out-of-range request like the synchronous path.
func TestServerAsyncIO(t *testing.T) {
	dir := t.TempDir()
	path := mkFile(t, dir, "disk.img", 8<<20, 0)
	tc := dialRNBD(t, testServerConfig(t, ServerConfig{DevSearchPath: dir, MaxIOSize: 126976, Logf: t.Logf, AsyncIO: true}), "sess-async")
	rsp, e := tc.open("disk.img", AccessRW)
	if e != 0 {
		t.Fatalf("OPEN: errno %d", e)
	}
	for i := range 64 {
		data := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		if e := tc.io(rsp.DeviceID, OpWrite, FlagSync|FlagFUA, int64(i)*8192, data, len(data)); e != 0 {
			t.Fatalf("WRITE %d: errno %d", i, e)
		}
		back := make([]byte, 4096)
		if e := tc.io(rsp.DeviceID, OpRead, FlagSync, int64(i)*8192, back, len(back)); e != 0 || !bytes.Equal(back, data) {
			t.Fatalf("READ %d: errno %d, equal %v", i, e, bytes.Equal(back, data))
		}
	}
	if e := tc.io(rsp.DeviceID, OpFlush, FlagSync|FlagFUA, 0, nil, 0); e != 0 {
		t.Fatalf("FLUSH: errno %d", e)
	}
	if e := tc.io(rsp.DeviceID, OpRead, FlagSync, 8<<20, make([]byte, 4096), 4096); e != -int(syscall.EIO) {
		t.Errorf("READ past the end: errno %d, want -EIO", e)
	}
	onDisk, _ := os.ReadFile(path)
	if onDisk[63*8192] != 64 || onDisk[63*8192+4095] != 64 {
		t.Error("the backing file does not hold what was written")
	}
}

// TestServerRepeatedOpenFollowsSize: a session's repeated open of an export
// answers its size now, and the mapping's I/O is range-checked against it,
// as the kernel's server reads the block device's size each time (what a
// client's resize asks).
func TestServerRepeatedOpenFollowsSize(t *testing.T) {
	dir := t.TempDir()
	path := mkFile(t, dir, "disk.img", 1<<20, 0)
	tc := dialRNBD(t, testServer(t, dir), "sess-grow")
	rsp := tc.mustOpen("disk.img", AccessRW)
	data := bytes.Repeat([]byte{0xa5}, 4096)
	if e := tc.io(rsp.DeviceID, OpWrite, 0, 1<<20, data, len(data)); e != -int(syscall.EIO) {
		t.Fatalf("write past the end: errno %d, want -EIO", e)
	}
	if err := os.Truncate(path, 2<<20); err != nil {
		t.Fatal(err)
	}
	// The range check stays at what the server last answered until the
	// session opens it again.
	if e := tc.io(rsp.DeviceID, OpWrite, 0, 1<<20, data, len(data)); e != -int(syscall.EIO) {
		t.Errorf("write past the answered end after the file grew: errno %d, want -EIO", e)
	}
	again := tc.mustOpen("disk.img", AccessRW)
	if again.DeviceID != rsp.DeviceID || again.NSectors != 2<<20>>9 {
		t.Fatalf("repeated open after growing: id %d, %d sectors; want id %d, %d", again.DeviceID, again.NSectors, rsp.DeviceID, 2<<20>>9)
	}
	if e := tc.io(rsp.DeviceID, OpWrite, 0, 1<<20, data, len(data)); e != 0 {
		t.Fatalf("write in the grown part: errno %d", e)
	}
	onDisk, _ := os.ReadFile(path)
	if !bytes.Equal(onDisk[1<<20:1<<20+4096], data) {
		t.Error("the file does not hold the write in the grown part")
	}
	if err := os.Truncate(path, 512<<10); err != nil {
		t.Fatal(err)
	}
	if shrunk := tc.mustOpen("disk.img", AccessRW); shrunk.NSectors != 512<<10>>9 {
		t.Errorf("repeated open after shrinking: %d sectors, want %d", shrunk.NSectors, 512<<10>>9)
	}
	if e := tc.io(rsp.DeviceID, OpRead, 0, 512<<10, data, len(data)); e != -int(syscall.EIO) {
		t.Errorf("read past the shrunk end: errno %d, want -EIO", e)
	}
}
