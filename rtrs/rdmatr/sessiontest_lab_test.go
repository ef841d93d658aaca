package rdmatr

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/sessiontest"
)

// The session tests that every transport runs (rtrs/internal/sessiontest),
// over soft-RoCE: the same assertions as rtrs/tcp's on the host.
func TestLabSessionSuite(t *testing.T) {
	needLab(t)
	sessiontest.Run(t, rdmaEnv{})
}

type rdmaEnv struct{}

// rdmaServer is a memory server on the lab's two paths.
type rdmaServer struct {
	t     *testing.T
	b     *memBackend
	srv   *Server
	addrs []netip.AddrPort
}

func (rdmaEnv) NewServer(t *testing.T) sessiontest.Server {
	s := &rdmaServer{t: t, b: &memBackend{mem: make([]byte, sessiontest.MemSize)}}
	s.listen(netip.AddrPortFrom(srv1, 0), netip.AddrPortFrom(srv2, 0))
	t.Cleanup(func() { s.srv.Close() })
	return s
}

func (s *rdmaServer) listen(addrs ...netip.AddrPort) {
	var err error
	s.srv, err = NewServer(ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: labQD, ChunkSize: labChunk, HeartbeatInterval: 100 * time.Millisecond, Logf: s.t.Logf}, Handler: s.b})
	if err != nil {
		s.t.Fatal(err)
	}
	s.addrs = s.addrs[:0]
	for _, a := range addrs {
		got, err := s.srv.Listen(a)
		if err != nil {
			s.t.Fatal(err)
		}
		s.addrs = append(s.addrs, got)
	}
}

func (s *rdmaServer) Paths() []rtrs.PathAddr {
	return []rtrs.PathAddr{{Src: cli1.String(), Dst: s.addrs[0].String()}, {Src: cli2.String(), Dst: s.addrs[1].String()}}
}

func (s *rdmaServer) Stop() { s.srv.Close() }

func (s *rdmaServer) FailPath(i int) {
	if n := s.srv.DisconnectPaths(s.addrs[i].Addr()); n == 0 {
		s.t.Errorf("FailPath(%d): the server has no path on %v", i, s.addrs[i])
	}
}

func (s *rdmaServer) Start() { s.listen(append([]netip.AddrPort(nil), s.addrs...)...) }

// rdmaClient is a Client with the suite's view of its queues and memory.
type rdmaClient struct{ *Client }

func (c rdmaClient) Queue(i int) rtrs.Queue { return c.Client.Queue(i) }
func (c rdmaClient) Memory() []byte         { return c.Region() }

func (rdmaEnv) Dial(t *testing.T, cfg rtrs.ClientConfig) (sessiontest.Client, error) {
	cfg.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := DialClient(ctx, ClientConfig{ClientConfig: cfg, RegionSize: cfg.Queues << 16})
	if err != nil {
		return nil, err
	}
	for i := 0; i < c.Queues(); i++ {
		go c.Queue(i).Run(nil)
	}
	t.Cleanup(func() { c.Close() })
	return rdmaClient{c}, nil
}
