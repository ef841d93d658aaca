package rnbd

import (
	"bytes"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/urnbd/urnbd/rtrs"
)

// Policy says which clients may open which exports, and with what highest
// access mode: a list of rules, any of which allows an OPEN that it
// matches. With a policy, an OPEN that no rule allows is refused with
// EACCES; without one, every client may open every export (the kernel's
// server). It is read from TOML (ParsePolicy):
//
//	[[allow]]
//	clients  = ["192.0.2.0/24", "2001:db8::/32"] # source address ranges; none: any
//	keys     = ["web-*"]                         # names of the keys the session proved (patterns); none: any, with or without a key
//	certs    = ["web*.example.com"]              # names of the client certificates it showed over TLS (patterns); none: any
//	sessions = ["web*"]                          # session name patterns (path.Match); none: any
//	exports  = ["disk*.img", "vol/*"]            # device_path patterns, as the client names it; none: any
//	access   = "rw"                              # highest access mode: ro, rw or migration
//
// A rule matches a session when every path of the session comes from one
// of its address ranges: the paths at the time of the OPEN (a path that
// joins later must know the session's paths_uuid, which only its client
// holds). A rule with keys matches only a session whose paths proved one
// of those keys (RTRS authentication, rtrs.ServerSession.Identity), and a
// rule with certs only one whose paths showed a client certificate of one
// of those names (TLS: subject common name, else first DNS name, URI or
// e-mail address; rtrs.ServerSession.CertName). Access
// modes rank ro < rw < migration.
//
// %SESSNAME% confinement of the search path (ServerConfig.DevSearchPath)
// applies on top of the policy.
type Policy struct {
	rules []policyRule
}

type policyRule struct {
	clients  []netip.Prefix
	keys     []string
	certs    []string
	sessions []string
	exports  []string
	access   AccessMode
}

// policyFile is the TOML layout.
type policyFile struct {
	Allow []struct {
		Clients  []string `toml:"clients"`
		Keys     []string `toml:"keys"`
		Certs    []string `toml:"certs"`
		Sessions []string `toml:"sessions"`
		Exports  []string `toml:"exports"`
		Access   string   `toml:"access"`
	} `toml:"allow"`
}

// ParsePolicy reads a policy from its TOML text. Unknown keys, bad
// address ranges, bad patterns and bad access modes are errors that name
// the rule; a policy with no rule allows nothing.
func ParsePolicy(text []byte) (*Policy, error) {
	var f policyFile
	md, err := toml.NewDecoder(bytes.NewReader(text)).Decode(&f)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("policy: unknown keys %s (want [[allow]] with clients, keys, certs, sessions, exports, access)", strings.Join(keys, ", "))
	}
	p := &Policy{}
	for i, a := range f.Allow {
		r := policyRule{keys: a.Keys, certs: a.Certs, sessions: a.Sessions, exports: a.Exports}
		for _, c := range a.Clients {
			pfx, err := parseClientRange(c)
			if err != nil {
				return nil, fmt.Errorf("policy: rule %d: clients %q: want an address or CIDR range: %w", i+1, c, err)
			}
			r.clients = append(r.clients, pfx)
		}
		for _, pat := range slices.Concat(a.Keys, a.Certs, a.Sessions, a.Exports) {
			if _, err := path.Match(pat, ""); err != nil {
				return nil, fmt.Errorf("policy: rule %d: pattern %q: %w", i+1, pat, err)
			}
		}
		for j, e := range r.exports {
			r.exports[j] = cleanExportName(e)
		}
		if a.Access == "" {
			return nil, fmt.Errorf("policy: rule %d: no access (want ro, rw or migration)", i+1)
		}
		if r.access, err = ParseAccessMode(a.Access); err != nil {
			return nil, fmt.Errorf("policy: rule %d: %w", i+1, err)
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

func parseClientRange(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// cleanExportName is a device_path as policies compare it: cleaned, no
// leading slash.
func cleanExportName(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// accessRank orders access modes: ro < rw < migration.
func accessRank(m AccessMode) int {
	switch m {
	case AccessRO:
		return 0
	case AccessRW:
		return 1
	}
	return 2
}

// Peer is who asks to open an export: what a policy rule can match.
type Peer struct {
	// Addrs are the source addresses of the session's paths.
	Addrs []netip.Addr
	// Key is the name of the key the session proved, "" for none.
	Key string
	// Cert is the name of the client certificate its paths showed, ""
	// for none.
	Cert string
	// Session is the session name.
	Session string
}

// String describes the peer for log lines.
func (p Peer) String() string {
	key, cert := p.Key, p.Cert
	if key == "" {
		key = "none"
	}
	if cert == "" {
		return fmt.Sprintf("session %q from %v, key %s", p.Session, p.Addrs, key)
	}
	return fmt.Sprintf("session %q from %v, key %s, certificate %q", p.Session, p.Addrs, key, cert)
}

// peerOf returns the peer of a server session.
func peerOf(rs *rtrs.ServerSession, name string) Peer {
	return Peer{Addrs: rs.PeerAddrs(), Key: rs.Identity(), Cert: rs.CertName(), Session: name}
}

// Allow reports whether peer may open export (its device_path) with mode;
// if not, the error says why.
func (p *Policy) Allow(peer Peer, export string, mode AccessMode) error {
	export = cleanExportName(export)
	matched := false // some rule matches the client and export, but not the mode
	for _, r := range p.rules {
		if !r.matchClient(peer.Addrs) || !matchNamed(r.keys, peer.Key) || !matchNamed(r.certs, peer.Cert) || !matchAny(r.sessions, peer.Session) || !matchAny(r.exports, export) {
			continue
		}
		if accessRank(mode) <= accessRank(r.access) {
			return nil
		}
		matched = true
	}
	if matched {
		return fmt.Errorf("access mode %s is above what the policy allows this client on %q", mode, export)
	}
	return fmt.Errorf("no policy rule allows this client to open %q", export)
}

// matchNamed matches an identity (a key or certificate name) against a
// rule's patterns: none match anyone, some only a peer that has a name.
func matchNamed(patterns []string, name string) bool {
	if len(patterns) == 0 {
		return true
	}
	return name != "" && matchAny(patterns, name)
}

func (r *policyRule) matchClient(addrs []netip.Addr) bool {
	if len(r.clients) == 0 {
		return true
	}
	if len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		in := false
		for _, c := range r.clients {
			if c.Contains(a.Unmap()) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return true
}

func matchAny(patterns []string, s string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}
