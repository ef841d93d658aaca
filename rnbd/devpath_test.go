package rnbd

import (
	"strings"
	"testing"
)

func TestResolveDevPath(t *testing.T) {
	for _, c := range []struct{ search, sess, dev, want string }{
		{"/", "s", "/dev/ram0", "/dev/ram0"},
		{"/", "s", "ram0", "/ram0"},
		{DefaultDevSearchPath, "s", "", "/"},
		{"/run/rnbd-devs/%SESSNAME%", "blya", "sda", "/run/rnbd-devs/blya/sda"},
		{"/run/rnbd-devs/%SESSNAME%/", "blya", "/sda", "/run/rnbd-devs/blya/sda"},
		{"/run/%SESSNAME%/tail/ignored", "blya", "sda", "/run/blya/sda"},
		{"%SESSNAME%", "blya", "sda", "/blya/sda"},
		{"/a/%SESSNAME%/%SESSNAME%", "s", "d", "/a/s/d"},
		{"/srv//exports/", "s", "//a///b/", "/srv/exports/a/b/"},
		{"dev", "s", "x", "dev/x"},
		{"/x", "s", "a.b/.c", "/x/a.b/.c"},
		{"/x", "s", "./y", "/x/./y"},
	} {
		got, err := ResolveDevPath(c.search, c.sess, c.dev)
		if err != nil || got != c.want {
			t.Errorf("ResolveDevPath(%q, %q, %q) = %q, %v; want %q", c.search, c.sess, c.dev, got, err, c.want)
		}
	}

	for _, dev := range []string{"..", "../etc/shadow", "a/../../b", "a..b", "/dev/..."} {
		_, err := ResolveDevPath("/", "s", dev)
		wantErr(t, err, ErrPathDotDot)
	}
	// ".." in the search path or session name is the operator's business.
	if got, err := ResolveDevPath("/a/../b", "s", "d"); err != nil || got != "/a/../b/d" {
		t.Errorf("got %q %v", got, err)
	}

	// Rule 1: search path + name >= PATH_MAX.
	_, err := ResolveDevPath("/"+strings.Repeat("a", 4000), "s", strings.Repeat("b", 95))
	wantErr(t, err, ErrPathTooLong)
	// Rule 4: sum 4095 passes rule 1 but the joined path is 4096 bytes.
	_, err = ResolveDevPath("/"+strings.Repeat("a", 4000), "s", strings.Repeat("b", 94))
	wantErr(t, err, ErrPathTooLong)
	got, err := ResolveDevPath("/"+strings.Repeat("a", 4000), "s", strings.Repeat("b", 93))
	if err != nil || len(got) != 4095 {
		t.Fatalf("len %d, %v", len(got), err)
	}
	// Rule 4 through %SESSNAME% expansion.
	_, err = ResolveDevPath("/"+strings.Repeat("a", 3800)+SessNameToken, strings.Repeat("s", 254), strings.Repeat("d", 254))
	wantErr(t, err, ErrPathTooLong)

	for _, in := range [][3]string{{"/\x00", "s", "d"}, {"/", "s\x00", "d"}, {"/", "s", "d\x00"}} {
		_, err = ResolveDevPath(in[0], in[1], in[2])
		wantErr(t, err, ErrOutOfRange)
	}
}

func FuzzResolveDevPath(f *testing.F) {
	f.Add("/", "blya", "/dev/ram0")
	f.Add("/run/rnbd-devs/%SESSNAME%", "blya", "sda")
	f.Add("//x//%SESSNAME%//y", "", "..//a")
	f.Fuzz(func(t *testing.T, search, sess, dev string) {
		got, err := ResolveDevPath(search, sess, dev)
		if err != nil {
			return
		}
		if strings.Contains(got, "//") || len(got) >= PathMax || strings.Contains(dev, "..") || !strings.Contains(got, "/") {
			t.Fatalf("ResolveDevPath(%q, %q, %q) = %q", search, sess, dev, got)
		}
		if !strings.Contains(search, SessNameToken) && !strings.HasPrefix(got, collapseSlashes(search)) {
			t.Fatalf("%q does not start with the search path %q", got, search)
		}
		if strings.Contains(got, "..") && !strings.Contains(search, ".") && !strings.Contains(sess, ".") {
			t.Fatalf("%q gained a ..", got)
		}
	})
}
