package rdmatr

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
)

// Authentication over RDMA between urnbd peers: the right key carries
// checked I/O and names the session; no key, an unknown key and a forged
// secret are refused with EACCES, and a keyed client refuses a server
// that does not authenticate.
func TestLabAuth(t *testing.T) {
	alice, err := rtrs.GenerateKey("alice")
	if err != nil {
		t.Fatal(err)
	}
	ring, err := rtrs.NewKeyRing([]rtrs.Key{alice})
	if err != nil {
		t.Fatal(err)
	}
	e := startLabEnv(t, &labEnv{auth: &rtrs.ServerAuth{Keys: ring, Required: true}, key: &alice}, 1, 2, 8, 0)
	time.Sleep(time.Second)
	if ops := e.stopAndCheck(t); ops < 50 {
		t.Errorf("only %d requests with authentication", ops)
	}
	if s := e.srv.tab.Lookup("labsess"); s == nil || s.Identity() != "alice" {
		t.Fatalf("server session %v, want identity alice", s)
	}

	dial := func(k *rtrs.Key, to netip.AddrPort) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := DialClient(ctx, ClientConfig{ClientConfig: rtrs.ClientConfig{SessName: "other", Queues: 1,
			Paths: []PathAddr{{Src: cli1.String(), Dst: to.String()}}, MaxReconnectAttempts: 0, Timeout: 10 * time.Second, Logf: t.Logf, Key: k},
			RegionSize: 1 << 20})
		if err == nil {
			c.Close()
		}
		return err
	}
	mallory, _ := rtrs.GenerateKey("mallory")
	forged := rtrs.Key{Name: "alice", Secret: []byte("not alice's secret")}
	for _, tc := range []struct {
		name string
		key  *rtrs.Key
		want string
	}{
		{"no key", nil, "requires authentication"},
		{"unknown key", &mallory, `refused key "mallory"`},
		{"forged secret", &forged, `refused key "alice"`},
	} {
		err := dial(tc.key, e.addrs[0])
		if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want EACCES saying %q", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}

	// A server without keys: the keyed client goes no further.
	plain, err := NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: labQD, ChunkSize: labChunk, Logf: t.Logf}, Handler: &memBackend{mem: make([]byte, 1<<20)}})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	a, err := plain.Listen(netip.AddrPortFrom(srv1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(&alice, a); !errors.Is(err, rtrs.ErrServerNoAuth) {
		t.Errorf("keyed client to a server without keys: %v, want ErrServerNoAuth", err)
	}
}
