package rnbd

import (
	"net/netip"
	"strings"
	"testing"
)

func TestPolicyAllow(t *testing.T) {
	p, err := ParsePolicy([]byte(`
[[allow]]
clients  = ["192.0.2.0/24", "2001:db8::1"]
sessions = ["web*"]
exports  = ["web/*.img"]
access   = "rw"

[[allow]]
exports = ["shared.img"]
access  = "ro"

[[allow]]
keys    = ["ops-*"]
exports = ["vault.img"]
access  = "rw"

[[allow]]
certs   = ["*.db.example"]
exports = ["db.img"]
access  = "rw"
`))
	if err != nil {
		t.Fatal(err)
	}
	lan, v6, other := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("198.51.100.9")
	mapped := netip.MustParseAddr("::ffff:192.0.2.8")
	for _, tc := range []struct {
		addrs   []netip.Addr
		key     string
		cert    string
		sess    string
		export  string
		mode    AccessMode
		allowed bool
		why     string
	}{
		{[]netip.Addr{lan}, "", "", "web1", "web/a.img", AccessRW, true, ""},
		{[]netip.Addr{lan, v6}, "", "", "web1", "/web/./a.img", AccessRO, true, ""},
		{[]netip.Addr{mapped}, "", "", "web1", "web/a.img", AccessRW, true, ""},
		{[]netip.Addr{lan}, "", "", "web1", "web/a.img", AccessMigration, false, "access mode"},
		{[]netip.Addr{lan, other}, "", "", "web1", "web/a.img", AccessRW, false, "no policy rule"},
		{[]netip.Addr{other}, "", "", "web1", "web/a.img", AccessRO, false, "no policy rule"},
		{nil, "", "", "web1", "web/a.img", AccessRO, false, "no policy rule"},
		{[]netip.Addr{lan}, "", "", "db1", "web/a.img", AccessRO, false, "no policy rule"},
		{[]netip.Addr{lan}, "", "", "web1", "web/../etc/shadow", AccessRO, false, "no policy rule"},
		{[]netip.Addr{other}, "", "", "anyone", "shared.img", AccessRO, true, ""},
		{[]netip.Addr{other}, "", "", "anyone", "shared.img", AccessRW, false, "access mode"},
		// A keys rule needs a session that proved a matching key.
		{[]netip.Addr{other}, "ops-alice", "", "anyone", "vault.img", AccessRW, true, ""},
		{[]netip.Addr{other}, "dev-bob", "", "anyone", "vault.img", AccessRO, false, "no policy rule"},
		{[]netip.Addr{other}, "", "", "anyone", "vault.img", AccessRO, false, "no policy rule"},
		{[]netip.Addr{lan}, "ops-alice", "", "web1", "web/a.img", AccessRW, true, ""}, // rules without keys match keyed sessions too
		{[]netip.Addr{other}, "", "a.db.example", "s", "db.img", AccessRW, true, ""},
		{[]netip.Addr{other}, "", "a.web.example", "s", "db.img", AccessRO, false, "no policy rule"},
		{[]netip.Addr{other}, "a.db.example", "", "s", "db.img", AccessRO, false, "no policy rule"}, // a key is not a certificate
	} {
		peer := Peer{Addrs: tc.addrs, Key: tc.key, Cert: tc.cert, Session: tc.sess}
		err := p.Allow(peer, tc.export, tc.mode)
		if (err == nil) != tc.allowed || (err != nil && !strings.Contains(err.Error(), tc.why)) {
			t.Errorf("Allow(%v, %q, %s) = %v, want allowed %v (%s)", peer, tc.export, tc.mode, err, tc.allowed, tc.why)
		}
	}
	empty, err := ParsePolicy(nil)
	if err != nil || empty.Allow(Peer{Addrs: []netip.Addr{lan}, Session: "web1"}, "web/a.img", AccessRO) == nil {
		t.Errorf("an empty policy: %v; it must allow nothing", err)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	for text, want := range map[string]string{
		"[[allow]]\naccess = \"rw\"\nclient = [\"10.0.0.0/8\"]\n":   "unknown keys allow.client",
		"[[allow]]\nclients = [\"10.0.0.0/33\"]\naccess = \"rw\"\n": "rule 1: clients",
		"[[allow]]\nexports = [\"[\"]\naccess = \"rw\"\n":           "rule 1: pattern",
		"[[allow]]\nexports = [\"a\"]\n":                            "rule 1: no access",
		"[[allow]]\naccess = \"all\"\n":                             "rule 1",
		"[[allow]\n":                                                "policy:",
		"[[allow]]\nkeys = [\"[\"]\naccess = \"rw\"\n":              "rule 1: pattern",
	} {
		if _, err := ParsePolicy([]byte(text)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePolicy(%q) = %v, want an error with %q", text, err, want)
		}
	}
}
