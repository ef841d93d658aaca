package rnbd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// exportTree makes dir/root (the search root) holding a 4 KiB file "f",
// and dir/out holding a 4 KiB file "secret". It returns the two paths.
func exportTree(t *testing.T) (root, out string) {
	t.Helper()
	dir := t.TempDir()
	root, out = filepath.Join(dir, "root"), filepath.Join(dir, "out")
	for _, d := range []string{root, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(root, "f"), 4096)
	writeFile(t, filepath.Join(out, "secret"), 4096)
	return root, out
}

func writeFile(t *testing.T, name string, size int) {
	t.Helper()
	if err := os.WriteFile(name, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+n : off+n]
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

// fileKey is the key openExport should give the regular file name.
func fileKey(t *testing.T, name string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// fdKey is the "DEV:INO" of an open fd.
func fdKey(t *testing.T, fd int) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

func mustOpenExport(t *testing.T, searchPath, sess, name string, ro bool) *backend {
	t.Helper()
	b, p, err := openExport(searchPath, sess, name, ro)
	if err != nil {
		t.Fatalf("openExport(%q, %q, %q): %v", searchPath, sess, name, err)
	}
	t.Cleanup(func() { b.f.Close() })
	if p != b.path {
		t.Errorf("returned path %q, backend path %q", p, b.path)
	}
	return b
}

// wantOpenErr checks that openExport fails with errno want.
func wantOpenErr(t *testing.T, searchPath, sess, name string, want syscall.Errno) error {
	t.Helper()
	b, _, err := openExport(searchPath, sess, name, true)
	if err == nil {
		b.f.Close()
		t.Fatalf("openExport(%q, %q, %q) succeeded (%s), want %v", searchPath, sess, name, b.path, want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("openExport(%q, %q, %q): %v, want %v", searchPath, sess, name, err, want)
	}
	return err
}

func TestOpenExportRegularFile(t *testing.T) {
	root, _ := exportTree(t)
	writeFile(t, filepath.Join(root, "big"), 1<<20)
	for _, ro := range []bool{true, false} {
		b := mustOpenExport(t, root, "s", "big", ro)
		if b.size.Load() != 1<<20 || b.lbs != 512 || b.blockDev || b.readOnly != ro {
			t.Errorf("ro=%v: size %d lbs %d blockDev %v readOnly %v", ro, b.size.Load(), b.lbs, b.blockDev, b.readOnly)
		}
		if want := filepath.Join(root, "big"); b.path != want {
			t.Errorf("path %q, want %q", b.path, want)
		}
		if want := fileKey(t, filepath.Join(root, "big")); b.key != want {
			t.Errorf("key %q, want %q", b.key, want)
		}
		if int(b.f.Fd()) != b.fd {
			t.Errorf("f.Fd() %d, fd %d", b.f.Fd(), b.fd)
		}
		if fl, err := unix.FcntlInt(uintptr(b.fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK != 0 {
			t.Errorf("F_GETFL %#x, %v: O_NONBLOCK still set", fl, err)
		}
		if ret := b.serve(MakeRW(OpRead, 0), 0, 4096, alignedBuf(4096)); ret != 0 {
			t.Errorf("read: %d", ret)
		}
		wantRet := 0
		if ro {
			wantRet = -int(syscall.EROFS)
		}
		if ret := b.serve(MakeRW(OpWrite, 0), 0, 4096, alignedBuf(4096)); ret != wantRet {
			t.Errorf("ro=%v: write: %d, want %d", ro, ret, wantRet)
		}
	}
	// Subdirectories, "." components and repeated slashes are fine.
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "sub", "g"), 512)
	if b := mustOpenExport(t, root+"/", "s", "./sub//g", true); b.size.Load() != 512 {
		t.Errorf("sub/g: size %d", b.size.Load())
	}
}

func TestOpenExportBlockDevice(t *testing.T) {
	root, _ := exportTree(t)
	img := filepath.Join(t.TempDir(), "img")
	writeFile(t, img, 8<<20)
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device (losetup --find --show: %v: %s); block device export not tested", err, strings.TrimSpace(string(out)))
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", loop).CombinedOutput(); err != nil {
			t.Logf("losetup --detach %s: %v: %s", loop, err, out)
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	// /dev is outside the root: make two device nodes of the loop device
	// beneath it.
	for _, n := range []string{"disk", "disk2"} {
		if err := unix.Mknod(filepath.Join(root, n), unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
			t.Skipf("mknod block device: %v", err)
		}
	}
	b, _, err := openExport(root, "s", "disk", false)
	if errors.Is(err, syscall.EACCES) {
		t.Skipf("temp dir refuses device nodes (nodev mount?): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.f.Close()
	if !b.blockDev || b.size.Load() != 8<<20 || b.lbs != 512 {
		t.Errorf("blockDev %v size %d lbs %d, want true %d 512", b.blockDev, b.size.Load(), b.lbs, 8<<20)
	}
	if want := fmt.Sprintf("blk:%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)); b.key != want {
		t.Errorf("key %q, want %q", b.key, want)
	}
	b2 := mustOpenExport(t, root, "s", "disk2", true)
	if b2.key != b.key {
		t.Errorf("two nodes of %s: keys %q and %q", loop, b.key, b2.key)
	}
	if ret := b.serve(MakeRW(OpWrite, FlagFUA), 4096, 4096, alignedBuf(4096)); ret != 0 {
		t.Errorf("write: %d", ret)
	}
}

func TestOpenExportSymlinkInside(t *testing.T) {
	root, _ := exportTree(t)
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, "f", filepath.Join(root, "l"))            // final component
	symlink(t, "../f", filepath.Join(root, "sub", "up")) // climbs, stays beneath
	symlink(t, "sub", filepath.Join(root, "dirlink"))    // intermediate component
	symlink(t, "l", filepath.Join(root, "chain"))        // link to a link
	want := fileKey(t, filepath.Join(root, "f"))
	for _, name := range []string{"l", "sub/up", "dirlink/up", "chain"} {
		if b := mustOpenExport(t, root, "s", name, true); b.key != want || b.size.Load() != 4096 {
			t.Errorf("%s: key %q size %d, want %q 4096", name, b.key, b.size.Load(), want)
		}
	}
}

func TestOpenExportSymlinkOutside(t *testing.T) {
	root, out := exportTree(t)
	secret := filepath.Join(out, "secret")
	cases := map[string]string{
		"abs":        secret,
		"rel":        "../out/secret",
		"absmissing": filepath.Join(out, "missing"),
		"relmissing": "../out/missing",
		"absinside":  filepath.Join(root, "f"), // absolute links are refused even pointing inside
		"rootparent": "..",
		"proc":       "/proc/self/root" + secret,
	}
	for name, target := range cases {
		symlink(t, target, filepath.Join(root, name))
	}
	for name := range cases {
		wantOpenErr(t, root, "s", name, syscall.EINVAL)
	}
	// A magic link beneath the root is refused too.
	wantOpenErr(t, "/proc/self", "s", "exe", syscall.EINVAL)

	// The answer is the same whether the outside target exists or not.
	for _, name := range []string{"abs", "rel"} {
		e1 := wantOpenErr(t, root, "s", name, syscall.EINVAL)
		if err := os.Rename(secret, secret+".away"); err != nil {
			t.Fatal(err)
		}
		e2 := wantOpenErr(t, root, "s", name, syscall.EINVAL)
		if err := os.Rename(secret+".away", secret); err != nil {
			t.Fatal(err)
		}
		if e1.Error() != e2.Error() {
			t.Errorf("%s: target present %q, absent %q", name, e1, e2)
		}
	}
}

func TestOpenExportNames(t *testing.T) {
	root, _ := exportTree(t)
	for _, name := range []string{"../out/secret", "f/..", "a..b", "", ".", "./", "//"} {
		wantOpenErr(t, root, "s", name, syscall.EINVAL)
	}
	e := wantOpenErr(t, root, "s", "../out/secret", syscall.EINVAL)
	if !errors.Is(e, ErrPathDotDot) {
		t.Errorf("%v does not wrap ErrPathDotDot", e)
	}
	wantOpenErr(t, root, "s", strings.Repeat("a", PathMax), syscall.EINVAL)
	wantOpenErr(t, root, "s", "missing", syscall.ENOENT)
	wantOpenErr(t, root, "s", "nodir/f", syscall.ENOENT)
	// An absolute name is appended to the root (as the kernel does).
	wantOpenErr(t, root, "s", "/etc/passwd", syscall.ENOENT)
	wantOpenErr(t, root, "s", "f/", syscall.ENOTDIR)

	e = wantOpenErr(t, filepath.Join(root, "nosuchroot"), "s", "f", syscall.ENOENT)
	if !strings.Contains(e.Error(), filepath.Join(root, "nosuchroot")) {
		t.Errorf("%q does not name the missing root", e)
	}
}

func TestOpenExportNotFileOrBlock(t *testing.T) {
	root, _ := exportTree(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o666))
	must(unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(os.Mkdir(filepath.Join(root, "dir"), 0o755))
	symlink(t, "fifo", filepath.Join(root, "fifolink"))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(root, "sock"), Net: "unix"})
	must(err)
	defer l.Close()

	// Opening the node (not O_PATH) would queue IN_OPEN. Kernels before
	// 6.5 report O_PATH opens too: then only the result is checked.
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	must(err)
	defer unix.Close(in)
	opened := func() bool {
		buf := make([]byte, 4096)
		n, err := unix.Read(in, buf)
		if err == unix.EAGAIN {
			return false
		}
		must(err)
		return n > 0
	}
	for _, n := range []string{"fifo", "null", "dir", "sock"} {
		if _, err := unix.InotifyAddWatch(in, filepath.Join(root, n), unix.IN_OPEN); err != nil {
			t.Fatal(err)
		}
	}
	pfd, err := unix.Open(filepath.Join(root, "null"), unix.O_PATH|unix.O_CLOEXEC, 0)
	must(err)
	unix.Close(pfd)
	watch := !opened()
	if !watch {
		t.Log("this kernel reports O_PATH opens to inotify: side effects not checked")
	}

	for _, name := range []string{"fifo", "fifolink", "null", "dir", "sock"} {
		for _, ro := range []bool{true, false} {
			done := make(chan error, 1)
			go func() {
				b, _, err := openExport(root, "s", name, ro)
				if b != nil {
					b.f.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, syscall.EINVAL) {
					t.Errorf("%s ro=%v: %v, want EINVAL", name, ro, err)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("%s ro=%v: openExport blocked for 2 s", name, ro)
			}
			if watch && opened() {
				t.Errorf("%s ro=%v: the node was opened", name, ro)
			}
		}
	}
}

func TestOpenExportSessionRoots(t *testing.T) {
	dir := t.TempDir()
	for _, s := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "b", "x"), 4096)
	symlink(t, "../b/x", filepath.Join(dir, "a", "lb"))
	symlink(t, filepath.Join(dir, "b", "x"), filepath.Join(dir, "a", "labs"))
	search := dir + "/%SESSNAME%/ignored"

	b := mustOpenExport(t, search, "b", "x", true)
	if want := filepath.Join(dir, "b", "x"); b.path != want {
		t.Errorf("path %q, want %q", b.path, want)
	}
	wantOpenErr(t, search, "a", "x", syscall.ENOENT)
	wantOpenErr(t, search, "a", "../b/x", syscall.EINVAL)
	wantOpenErr(t, search, "a", "lb", syscall.EINVAL)
	wantOpenErr(t, search, "a", "labs", syscall.EINVAL)
	for _, s := range []string{"", ".", "..", "../b", "a/../b", "b/"} {
		wantOpenErr(t, search, s, "x", syscall.EINVAL)
	}
	wantOpenErr(t, search, "c", "x", syscall.ENOENT) // root of c missing
}

func TestOpenExportHardLinkKey(t *testing.T) {
	root, _ := exportTree(t)
	if err := os.Link(filepath.Join(root, "f"), filepath.Join(root, "g")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "h"), 4096)
	bf := mustOpenExport(t, root, "s", "f", true)
	bg := mustOpenExport(t, root, "s", "g", false)
	bh := mustOpenExport(t, root, "s", "h", true)
	if bf.key != bg.key {
		t.Errorf("hard links f, g: keys %q, %q", bf.key, bg.key)
	}
	if bf.key == bh.key {
		t.Errorf("distinct files f, h: same key %q", bf.key)
	}
	if bf.path == bg.path {
		t.Errorf("hard links f, g: same display path %q", bf.path)
	}
}

// TestOpenExportSwapRace swaps the exported name between the inside file
// and a symlink to an outside file while opening it: every open that
// succeeds must hold the inside file.
func TestOpenExportSwapRace(t *testing.T) {
	for _, kind := range []string{"abs", "rel"} {
		t.Run(kind, func(t *testing.T) {
			root, out := exportTree(t)
			target := filepath.Join(out, "secret")
			if kind == "rel" {
				target = "../out/secret"
			}
			name, alt := filepath.Join(root, "name"), filepath.Join(root, "alt")
			if err := os.Link(filepath.Join(root, "f"), name); err != nil {
				t.Fatal(err)
			}
			symlink(t, target, alt)
			inside := fileKey(t, filepath.Join(root, "f"))
			outside := fileKey(t, filepath.Join(out, "secret"))

			stopSwapping := swapNames(t, name, alt)
			var ok, refused, changed int
			for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
				b, _, err := openExport(root, "s", "name", ok%2 == 0)
				if err != nil {
					if !errors.Is(err, syscall.EINVAL) {
						t.Errorf("open: %v, want EINVAL or success", err)
						break
					}
					if strings.Contains(err.Error(), "changed while opening") {
						changed++
					}
					refused++
					continue
				}
				got := fdKey(t, b.fd)
				b.f.Close()
				if got == outside || got != inside || b.key != inside {
					t.Fatalf("opened %s (key %s); inside %s, outside %s", got, b.key, inside, outside)
				}
				ok++
			}
			swaps := stopSwapping()
			t.Logf("%d swaps: %d opens of the inside file, %d refused (%d changed while opening)", swaps, ok, refused, changed)
			if ok == 0 || refused == 0 {
				t.Errorf("the race was not exercised: %d opens, %d refusals", ok, refused)
			}
		})
	}
}

// TestOpenExportSwapInside swaps the exported name between two inside
// files: an open either holds one of them, under its own key, or is
// refused as changed while opening.
func TestOpenExportSwapInside(t *testing.T) {
	root, _ := exportTree(t)
	name, alt := filepath.Join(root, "name"), filepath.Join(root, "alt")
	writeFile(t, name, 4096)
	writeFile(t, alt, 8192)
	sizes := map[string]uint64{fileKey(t, name): 4096, fileKey(t, alt): 8192}

	stopSwapping := swapNames(t, name, alt)
	var ok, changed int
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		b, _, err := openExport(root, "s", "name", true)
		if err != nil {
			if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "changed while opening") {
				t.Fatalf("open: %v, want success or changed while opening", err)
			}
			changed++
			continue
		}
		got := fdKey(t, b.fd)
		b.f.Close()
		if size, known := sizes[got]; !known || b.key != got || b.size.Load() != size {
			t.Fatalf("opened %s (key %s, size %d); want one of %v", got, b.key, b.size.Load(), sizes)
		}
		ok++
	}
	stopSwapping()
	t.Logf("%d opens, %d refused as changed while opening", ok, changed)
	if ok == 0 {
		t.Error("no open succeeded")
	}
}

// swapNames exchanges two names (RENAME_EXCHANGE) in a loop until the
// returned function is called, which returns the number of swaps.
func swapNames(t *testing.T, a, b string) (stop func() int) {
	var done atomic.Bool
	var swaps int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done.Load() {
			if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("RENAME_EXCHANGE: %v", err)
				return
			}
			swaps++
		}
	}()
	return func() int {
		done.Store(true)
		wg.Wait()
		return swaps
	}
}
