package rdmatr

import "testing"

func TestRegionOffset(t *testing.T) {
	region := make([]byte, 4096)
	other := make([]byte, 16)
	cases := []struct {
		b    []byte
		off  int
		okay bool
	}{
		{region[:10], 0, true},
		{region[100:200], 100, true},
		{region[4000:4096], 4000, true},
		{region[4096:], 0, true}, // empty
		{nil, 0, true},
		{other, 0, false},
		{region[4095:4096], 4095, true},
	}
	for i, c := range cases {
		off, ok := regionOffset(region, c.b)
		if ok != c.okay || (ok && off != c.off) {
			t.Errorf("case %d: got (%d, %v), want (%d, %v)", i, off, ok, c.off, c.okay)
		}
	}
	if _, ok := regionOffset(region[:100], region[50:150]); ok {
		t.Error("a range running past the region's end was accepted")
	}
}

func TestPathStateName(t *testing.T) {
	for s, want := range map[int32]string{PathStateConnecting: "connecting", PathStateConnected: "connected",
		PathStateReconnecting: "reconnecting", PathStateDisconnected: "disconnected", 42: "unknown"} {
		if got := PathStateName(s); got != want {
			t.Errorf("PathStateName(%d) = %q, want %q", s, got, want)
		}
	}
}

func TestParseAddr(t *testing.T) {
	ap, err := parseAddr("192.0.2.2", 1234)
	if err != nil || ap.String() != "192.0.2.2:1234" {
		t.Fatalf("got %v, %v", ap, err)
	}
	ap, err = parseAddr("192.0.2.2:77", 1234)
	if err != nil || ap.Port() != 77 {
		t.Fatalf("got %v, %v", ap, err)
	}
	if _, err := parseAddr("nonsense", 1); err == nil {
		t.Fatal("bad address accepted")
	}
}
