package tcp

import (
	"context"
	"net"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/sessiontest"
)

// The session tests that every transport runs (rtrs/internal/sessiontest),
// over loopback.
func TestSessionSuite(t *testing.T) { sessiontest.Run(t, tcpEnv{}) }

type tcpEnv struct{}

// tcpServer is a memory server on two loopback ports, each path through
// a proxy (which FailPath cuts).
type tcpServer struct {
	t       *testing.T
	b       *memBackend
	srv     *Server
	addrs   []string
	proxies []*proxy
}

func (tcpEnv) NewServer(t *testing.T) sessiontest.Server {
	s := &tcpServer{t: t, b: newMemBackend(sessiontest.MemSize)}
	var a string
	s.srv, a = startIOServer(t, s.b, "127.0.0.1:0")
	s.addrs = []string{a, addListener(t, s.srv)}
	s.proxies = []*proxy{startProxy(t, s.addrs[0]), startProxy(t, s.addrs[1])}
	return s
}

func (s *tcpServer) Paths() []rtrs.PathAddr {
	return []rtrs.PathAddr{{Src: "127.0.0.1", Dst: s.proxies[0].addr()}, {Src: "127.0.0.1", Dst: s.proxies[1].addr()}}
}

func (s *tcpServer) FailPath(i int) { s.proxies[i].cut() }

func (s *tcpServer) Stop() { s.srv.Close() }

func (s *tcpServer) Start() {
	s.srv, _ = startIOServer(s.t, s.b, s.addrs[0])
	ln, err := net.Listen("tcp", s.addrs[1])
	if err != nil {
		s.t.Fatal(err)
	}
	go s.srv.Serve(ln)
}

// tcpClient is a Client with the suite's view of its queues and memory.
type tcpClient struct {
	*Client
	mem []byte
}

func (c tcpClient) Queue(i int) rtrs.Queue { return c.Client.Queue(i) }
func (c tcpClient) Memory() []byte         { return c.mem }

func (tcpEnv) Dial(t *testing.T, cfg rtrs.ClientConfig) (sessiontest.Client, error) {
	c, err := DialClient(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	for i := 0; i < c.Queues(); i++ {
		go c.Queue(i).Run(nil)
	}
	t.Cleanup(func() { c.Close() })
	return tcpClient{Client: c, mem: make([]byte, c.Queues()<<16)}, nil
}
