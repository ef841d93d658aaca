package tcp_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
)

// memory is a ServerHandler over memory: the user message is the le64 byte
// offset of the request's data.
type memory struct {
	mu  sync.Mutex
	mem []byte
}

func (m *memory) HandleIO(io *tcp.ServerIO) {
	off := binary.LittleEndian.Uint64(io.Usr)
	if len(io.Usr) != 8 || off+uint64(len(io.Data)) > uint64(len(m.mem)) {
		io.Complete(-22) // -EINVAL
		return
	}
	m.mu.Lock()
	if io.Write {
		copy(m.mem[off:], io.Data)
	} else {
		copy(io.Data, m.mem[off:])
	}
	m.mu.Unlock()
	io.Complete(0)
}

// A server on loopback and a client session with one queue: a write, then
// a read of what it wrote.
func ExampleDialClient() {
	srv, err := tcp.NewServer(tcp.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: 16}, Handler: &memory{mem: make([]byte, 1<<20)}})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tcp.DialClient(ctx, tcp.ClientConfig{SessName: "example", Queues: 1,
		Paths: []rtrs.PathAddr{{Dst: ln.Addr().String()}}})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	q := c.Queue(0)
	go q.Run(nil) // the queue's own thread and io_uring

	var usr [8]byte
	binary.LittleEndian.PutUint64(usr[:], 4096) // where: byte 4096
	done := make(chan int)
	r := &tcp.Request{Write: true, Usr: usr[:], Data: []byte("hello, block"), Done: func(_ *tcp.Request, errno int) { done <- errno }}
	q.Do(func() { q.Submit(r) }) // requests are submitted on the queue's thread
	fmt.Println("write:", <-done)

	r.Write, r.Data = false, make([]byte, 12)
	q.Do(func() { q.Submit(r) })
	fmt.Println("read:", <-done, string(r.Data))
	fmt.Println("path:", c.Paths()[0].State)
	// Output:
	// write: 0
	// read: 0 hello, block
	// path: connected
}
