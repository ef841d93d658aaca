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

// driveThenDetach drives q from a loop of its own until q has taken its
// connection of path 0, then stops the loop (Detach), as RNBD does when it
// unmaps a device.
func driveThenDetach(t *testing.T, q *ClientQueue) {
	t.Helper()
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
		q.Attach(ring, 0)
		deadline := time.Now().Add(5 * time.Second)
		for (len(q.core.Slots) == 0 || q.core.Slots[0] == nil) && time.Now().Before(deadline) {
			q.Flush()
			if _, err := ring.SubmitAndWait(1); err != nil {
				detached <- err
				return
			}
			ring.ForEachCQE(q.HandleCQE)
		}
		if len(q.core.Slots) == 0 || q.core.Slots[0] == nil {
			detached <- context.DeadlineExceeded
			return
		}
		q.Detach()
		detached <- nil
	}()
	if err := <-detached; err != nil {
		t.Fatalf("queue %d's loop: %v", q.ID(), err)
	}
}

// dialRunFirst dials a client of n queues of which only queue 0 is run
// (Run); ran gets Run's result. The caller closes the client.
func dialRunFirst(t *testing.T, addr string, n int) (c *Client, ran <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialClient(ctx, ClientConfig{SessName: "close", Queues: n, Policy: rtrs.RoundRobin,
		Paths: []PathAddr{{Dst: addr}}, MaxReconnectAttempts: -1, ReconnectDelay: 50 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, MissedHeartbeats: 5, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Queue(0).Run(nil) }()
	return c, done
}

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

	c, ran := dialRunFirst(t, addr, 3)

	// Queue 1: an outside loop takes its connection, then stops.
	driveThenDetach(t, c.Queue(1))
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

// A path that reconnects again and again while a queue is detached does
// not pile up sockets for that queue: each connect's socket for it
// replaces the one before, not taken yet.
func TestDetachedQueueKeepsOneSocketPerPath(t *testing.T) {
	_, addr := startIOServer(t, newMemBackend(1<<20), "127.0.0.1:0")
	c, ran := dialRunFirst(t, addr, 2)
	defer func() {
		c.Close()
		<-ran
	}()
	driveThenDetach(t, c.Queue(1))
	state := func() string { return c.Paths()[0].State }
	flap := func() {
		t.Helper()
		if err := c.DisconnectPath(0); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for state() == "connected" && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if err := c.ReconnectPath(0); err != nil {
			t.Fatal(err)
		}
		for state() != "connected" && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if state() != "connected" {
			t.Fatalf("path 0 is %s after a reconnect", state())
		}
	}
	flap()
	time.Sleep(100 * time.Millisecond) // the server closes its ends of the old connections
	base := openFDs(t)
	const flaps = 6
	for range flaps {
		flap()
	}
	time.Sleep(100 * time.Millisecond)
	if n := openFDs(t); n > base+2 {
		t.Errorf("%d descriptors open after %d more reconnects, %d before: the detached queue piles up sockets", n, flaps, base)
	}
}
