package tcp

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/uring"
)

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// Closing a client frees every descriptor it opened (sockets, mailbox
// eventfds), whatever drives its queues: Run, a loop that has stopped
// (Detach, as when RNBD unmaps a device), or nothing yet. The server's
// ends close too, once it sees the client go.
func TestClientCloseReleasesDescriptors(t *testing.T) {
	_, addr := startIOServer(t, newMemBackend(1<<20), "127.0.0.1:0")
	before := openFDs(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialClient(ctx, ClientConfig{SessName: "close", Queues: 3, Policy: rtrs.RoundRobin,
		Paths: []PathAddr{{Dst: addr}}, ReconnectDelay: 50 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 5, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Queue(0).Run(nil) }()

	// Queue 1: an outside loop takes its connection, then stops.
	detached := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ring, err := uring.New(64, 0)
		if err != nil {
			detached <- err
			return
		}
		defer ring.Close()
		q := c.Queue(1)
		q.Attach(ring, 0)
		deadline := time.Now().Add(5 * time.Second)
		for (len(q.slots) == 0 || q.slots[0] == nil) && time.Now().Before(deadline) {
			q.Flush()
			if _, err := ring.SubmitAndWait(1); err != nil {
				detached <- err
				return
			}
			ring.ForEachCQE(q.HandleCQE)
		}
		if len(q.slots) == 0 || q.slots[0] == nil {
			detached <- context.DeadlineExceeded
			return
		}
		q.Detach()
		detached <- nil
	}()
	if err := <-detached; err != nil {
		t.Fatalf("queue 1's loop: %v", err)
	}
	// Queue 2 is never driven.

	if n := openFDs(t); n <= before {
		t.Fatalf("%d descriptors open with the client up, %d before: the test sees nothing", n, before)
	}
	c.Close()
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("queue 0's Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("queue 0's Run did not return after Close")
	}
	deadline := time.Now().Add(5 * time.Second)
	n := openFDs(t)
	for n > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = openFDs(t)
	}
	if n > before {
		t.Errorf("%d descriptors open 5 s after Close, %d before the client", n, before)
	}
}
