package session

import (
	"fmt"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
)

func TestLinkEventsAndHold(t *testing.T) {
	var events []string
	l := NewLink(true, func(ev rtrs.LinkEvent, gen uint64) { events = append(events, fmt.Sprintf("%v %d", ev, gen)) })
	var a, b PathState
	a.Bind(l)
	b.Bind(l)

	a.Store(PathStateConnecting)
	a.Store(PathStateConnected) // the first connect is no reconnect
	b.Store(PathStateConnected)
	a.Store(PathStateReconnecting) // one path of two down: no event
	if l.Held() || len(events) != 0 {
		t.Fatalf("after the first connects and one path down: held %v, events %v", l.Held(), events)
	}
	b.Store(PathStateReconnecting) // the last one down
	b.Store(PathStateReconnecting) // stays down: counted once
	b.Store(PathStateConnected)    // back
	if !l.Held() {
		t.Error("IO not held after the session reconnected")
	}
	a.Store(PathStateConnected) // the second path: no event, still held
	if l.Resume(0) || !l.Held() {
		t.Error("a Resume for an older reconnect let IO go")
	}
	if !l.Resume(1) || l.Held() {
		t.Error("Resume(1) did not let IO go")
	}
	if l.Resume(1) {
		t.Error("a second Resume reported IO held")
	}
	want := []string{"disconnected 0", "reconnected 1"}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Errorf("events %v, want %v", events, want)
	}

	// Down and up again before the user resumed: the old reconnect's
	// Resume does not let IO go.
	a.Store(PathStateRemoved)
	b.Store(PathStateDisconnected)
	b.Store(PathStateConnected)
	b.Store(PathStateReconnecting)
	b.Store(PathStateConnected)
	if l.Resume(2) || !l.Held() || !l.Resume(3) {
		t.Errorf("after two more reconnects: events %v, held %v", events, l.Held())
	}

	var free PathState // no link: only the state
	free.Store(PathStateConnected)
	if free.Load() != PathStateConnected || (*Link)(nil).Held() {
		t.Error("a path state without a link")
	}
	noHold := NewLink(false, nil)
	var c PathState
	c.Bind(noHold)
	c.Store(PathStateConnected)
	c.Store(PathStateReconnecting)
	c.Store(PathStateConnected)
	if noHold.Held() {
		t.Error("a link without hold held IO")
	}
}

func TestFencedGen(t *testing.T) {
	var f FencedGen
	if !f.Advance(3) || f.Load() != 3 {
		t.Fatal("3")
	}
	if f.Advance(2) || f.Advance(3) || f.Load() != 3 {
		t.Fatal("a fence went back")
	}
	if !f.Advance(4) || f.Load() != 4 {
		t.Fatal("4")
	}
}
