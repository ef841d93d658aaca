// Package rnbdtest runs an RNBD server over RTRS/TCP on loopback for the
// tests of the packages above rnbd (rnbd's own tests have their own, in
// the package).
package rnbdtest

import (
	"net"
	"testing"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// ServeTCP starts an RNBD server with cfg over RTRS/TCP on a loopback
// port, stopped when the test ends, and returns its address.
func ServeTCP(t testing.TB, cfg rnbd.ServerConfig) string {
	t.Helper()
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	srv, err := rnbd.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tab := rtrs.NewServerTable(rtrs.ServerTableConfig{OnRelease: srv.ReleaseSession, Logf: cfg.Logf})
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
		srv.Close()
	})
	return ln.Addr().String()
}
