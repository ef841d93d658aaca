package clientd

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMapString(t *testing.T) {
	s, err := ParseMapString([]string{"sessname=s1 path=ip:192.0.2.1@ip:192.0.2.2 dest_port=4000 path=ip:198.51.100.2 device_path=/dev/nullb0 access_mode=migration"})
	if err != nil {
		t.Fatal(err)
	}
	if s.SessName != "s1" || s.DevicePath != "/dev/nullb0" || s.AccessMode != "migration" || len(s.Paths) != 2 {
		t.Fatalf("%+v", s)
	}
	if p := s.Paths[0]; p.Src != "192.0.2.1" || p.Dst != "192.0.2.2" || p.Port != 1234 {
		t.Errorf("path 0: %+v (dest_port applies only to later paths)", p)
	}
	if p := s.Paths[1]; p.Src != "" || p.Dst != "198.51.100.2" || p.Port != 4000 {
		t.Errorf("path 1: %+v", p)
	}
	if s2, err := ParseMapString([]string{"sessname=x", "path=ip:127.0.0.1,ip:127.0.0.2", "device_path=d"}); err != nil || s2.AccessMode != "rw" || s2.Paths[0].Src != "127.0.0.1" {
		t.Errorf("comma separator, default access mode: %+v %v", s2, err)
	}
	for _, in := range []string{
		"path=ip:127.0.0.1 device_path=d",              // no sessname
		"sessname=x path=ip:127.0.0.1",                 // no device_path
		"sessname=a.b path=ip:127.0.0.1 device_path=d", // '.' in sessname
		"sessname=x path=ip:300.0.0.1 device_path=d",   // bad address
		"sessname=x path=ip:127.0.0.1 device_path=d access_mode=rwx",
		"sessname=x path=ip:127.0.0.1 device_path=d foo=bar", // unknown key
		"sessname=x path=ip:127.0.0.1 device_path=d dest_port=70000",
		"sessname=x path=ip:127.0.0.1 device_path", // no value
	} {
		if _, err := ParseMapString([]string{in}); !errors.Is(err, unix.EINVAL) {
			t.Errorf("%q: %v, want EINVAL", in, err)
		}
	}
	// Whether a map string without path= is right depends on the session
	// existing, which only the client daemon knows.
	if s, err := ParseMapString([]string{"sessname=x device_path=d"}); err != nil || len(s.Paths) != 0 {
		t.Errorf("no path: %+v, %v; want no paths and no error", s, err)
	}
	seven := "sessname=x device_path=d"
	for i := 0; i < 7; i++ {
		seven += " path=ip:127.0.0.1"
	}
	if _, err := ParseMapString([]string{seven}); !errors.Is(err, unix.ENOMEM) {
		t.Errorf("7 paths: %v, want ENOMEM", err)
	}
}
