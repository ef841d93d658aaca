package session

import (
	"errors"
	"syscall"
	"testing"
)

func TestPathState(t *testing.T) {
	for s, want := range map[int32]string{PathStateConnecting: "connecting", PathStateConnected: "connected",
		PathStateReconnecting: "reconnecting", PathStateDisconnected: "disconnected", PathStateRemoved: "removed", 42: "unknown"} {
		if got := PathStateName(s); got != want {
			t.Errorf("PathStateName(%d) = %q, want %q", s, got, want)
		}
	}
	for s, want := range map[int32]bool{PathStateConnecting: true, PathStateConnected: true,
		PathStateReconnecting: true, PathStateDisconnected: false, PathStateRemoved: false} {
		if PathHasHope(s) != want {
			t.Errorf("PathHasHope(%s) = %v", PathStateName(s), !want)
		}
	}
}

func TestReconnectLimit(t *testing.T) {
	var l ReconnectLimit
	if !l.Reached(0) {
		t.Error("zero limit: no reconnect allowed, but Reached(0) is false")
	}
	if err := l.Set(3); err != nil {
		t.Fatal(err)
	}
	if l.Get() != 3 || l.Reached(2) || !l.Reached(3) {
		t.Errorf("limit 3: Get %d, Reached(2) %v, Reached(3) %v", l.Get(), l.Reached(2), l.Reached(3))
	}
	if err := l.Set(-1); err != nil {
		t.Fatal(err)
	}
	if l.Reached(1 << 30) {
		t.Error("limit -1 reached")
	}
	if err := l.Set(-2); !errors.Is(err, syscall.EINVAL) || l.Get() != -1 {
		t.Errorf("Set(-2): %v, limit now %d; want EINVAL and -1 kept", err, l.Get())
	}
}

// Replace takes the stale messages out, in order, hands them to drop, and
// wakes the receiver; after Close the new message itself is dropped.
