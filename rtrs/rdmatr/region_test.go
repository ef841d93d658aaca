package rdmatr

import "testing"

func TestRegionPart(t *testing.T) {
	region := make([]byte, 10000)
	other := make([]byte, 16)
	c := &Client{region: region}
	if err := c.splitRegion(4096); err != nil || c.RegionParts() != 3 {
		t.Fatalf("split 10000 bytes in parts of 4096: %v, %d parts", err, c.RegionParts())
	}
	c.parts[1].Store(true) // only the middle part is registered
	c.parts[2].Store(true)
	cases := []struct {
		b         []byte
		part, off int
		okay      bool
	}{
		{region[4096:4106], 1, 0, true},
		{region[5000:8192], 1, 904, true},
		{region[8192:10000], 2, 0, true},    // the last, shorter part
		{region[100:200], 0, 100, false},    // part 0 is not registered
		{region[8000:8300], 1, 3904, false}, // straddles parts 1 and 2
		{region[10000:], 0, 0, true},        // empty
		{nil, 0, 0, true},
		{other, 0, 0, false},
		{region[9999:10000], 2, 1807, true},
	}
	for i, tc := range cases {
		part, off, ok := c.regionPart(tc.b)
		if ok != tc.okay || (ok && len(tc.b) > 0 && (part != tc.part || off != tc.off)) {
			t.Errorf("case %d: got (%d, %d, %v), want (%d, %d, %v)", i, part, off, ok, tc.part, tc.off, tc.okay)
		}
	}
	if err := c.RegisterPart(3); err == nil {
		t.Error("RegisterPart(3) of 3 parts succeeded")
	}
	// Without a set (no path connected) registering is only bookkeeping.
	if err := c.RegisterPart(0); err != nil || !c.parts[0].Load() {
		t.Errorf("RegisterPart(0) with no set: %v", err)
	}

	whole := &Client{region: region[:100]}
	if err := whole.splitRegion(0); err != nil || whole.RegionParts() != 1 {
		t.Fatalf("whole region: %v, %d parts", err, whole.RegionParts())
	}
	if _, off, ok := whole.regionPart(region[50:100]); !ok || off != 50 {
		t.Errorf("whole region: got (%d, %v)", off, ok)
	}
	if _, _, ok := whole.regionPart(region[50:150]); ok {
		t.Error("a range running past the region's end was accepted")
	}
	if err := whole.splitRegion(-1); err == nil {
		t.Error("a negative part size was accepted")
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
