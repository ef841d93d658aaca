package clientd

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rnbd"
)

// MapSpec is what a map request names: the kernel's map_device string or
// the flag form say the same things.
type MapSpec struct {
	SessName   string    `json:"sessname"`
	Paths      []MapPath `json:"paths"`
	DevicePath string    `json:"device_path"`
	AccessMode string    `json:"access_mode"`
	Transport  string    `json:"transport"`
	// AuthKey is the absolute path of the session's key file (auth_key=;
	// keyfile.ReadOne): the client proves that key to the server.
	AuthKey string `json:"auth_key,omitempty"`
	// TLS runs a TCP session over TLS 1.3 (tls=on, or any tls_ key):
	// TLSCA verifies the server (absolute path of a PEM bundle; none: the
	// system's roots), TLSCert and TLSKey are the client's certificate,
	// TLSServerName the name to verify (none: each path's address).
	TLS           bool   `json:"tls,omitempty"`
	TLSCA         string `json:"tls_ca,omitempty"`
	TLSCert       string `json:"tls_cert,omitempty"`
	TLSKey        string `json:"tls_key,omitempty"`
	TLSServerName string `json:"tls_server_name,omitempty"`
	// Mode is AccessMode parsed (ParseMapString, CheckMode).
	Mode rnbd.AccessMode `json:"-"`
}

// CheckMode parses AccessMode into Mode, for a spec that came as JSON.
// Errors wrap EINVAL.
func (s *MapSpec) CheckMode() error {
	m, err := rnbd.ParseAccessMode(s.AccessMode)
	if err != nil {
		return fmt.Errorf("access_mode %q: %w", s.AccessMode, unix.EINVAL)
	}
	s.Mode = m
	return nil
}

// MapPath is one path=[src@]dst with its port.
type MapPath struct {
	Src  string `json:"src,omitempty"`
	Dst  string `json:"dst"`
	Port int    `json:"port"`
}

// String returns the path in the kernel's syntax, ip:[src@]ip:dst.
func (p MapPath) String() string {
	s := "ip:" + p.Dst
	if p.Src != "" {
		s = "ip:" + p.Src + "@" + s
	}
	return s
}

// ParseMapString parses the kernel's map_device syntax (RNBD sysfs ABI):
// space-separated key=value tokens: sessname, path=[src@|,]dst (addresses
// as ip:ADDR), device_path, access_mode, dest_port (applies to the paths
// after it). Errors wrap EINVAL, as the kernel's.
func ParseMapString(tokens []string) (*MapSpec, error) {
	s := &MapSpec{AccessMode: "rw"}
	port := 1234
	bad := func(format string, args ...any) (*MapSpec, error) {
		return nil, fmt.Errorf(format+": %w", append(args, unix.EINVAL)...)
	}
	for _, tok := range tokens {
		for _, t := range strings.Fields(tok) {
			k, v, ok := strings.Cut(t, "=")
			if !ok || v == "" {
				return bad("map: %q is not key=value", t)
			}
			switch k {
			case "sessname":
				if len(v) > 255 || strings.ContainsAny(v, "/.") {
					return bad("map: sessname %q: at most 255 characters, no '/' or '.'", v)
				}
				s.SessName = v
			case "device_path":
				if len(v) >= rnbd.DevNameLen {
					return bad("map: device_path of %d characters, at most %d", len(v), rnbd.DevNameLen-1)
				}
				s.DevicePath = v
			case "access_mode":
				if _, err := rnbd.ParseAccessMode(v); err != nil {
					return bad("map: access_mode %q: want ro, rw or migration", v)
				}
				s.AccessMode = v
			case "dest_port":
				p, err := strconv.Atoi(v)
				if err != nil || p < 0 || p > 65535 {
					return bad("map: dest_port %q: want 0..65535", v)
				}
				port = p
			case "path":
				mp, err := ParsePathArg(v, port)
				if err != nil {
					return nil, err
				}
				if len(s.Paths) == 6 {
					return nil, fmt.Errorf("map: more than 6 paths: %w", unix.ENOMEM)
				}
				s.Paths = append(s.Paths, mp)
			case "transport":
				if v != "tcp" && v != "rdma" {
					return bad("map: transport %q: want tcp or rdma", v)
				}
				s.Transport = v
			case "auth_key", "tls_ca", "tls_cert", "tls_key":
				abs, err := filepath.Abs(v)
				if err != nil {
					return bad("map: %s %q: %v", k, v, err)
				}
				switch k {
				case "auth_key":
					s.AuthKey = abs
				case "tls_ca":
					s.TLSCA, s.TLS = abs, true
				case "tls_cert":
					s.TLSCert, s.TLS = abs, true
				case "tls_key":
					s.TLSKey, s.TLS = abs, true
				}
			case "tls":
				switch v {
				case "on":
					s.TLS = true
				case "off":
					s.TLS = false
				default:
					return bad("map: tls %q: want on or off", v)
				}
			case "tls_server_name":
				s.TLSServerName, s.TLS = v, true
			case "nr_poll_queues":
				return bad("map: nr_poll_queues: urnbd has no poll queues")
			default:
				return bad("map: unknown key %q (want sessname, path, device_path, access_mode, dest_port, transport, auth_key, tls, tls_ca, tls_cert, tls_key, tls_server_name)", k)
			}
		}
	}
	switch {
	case s.SessName == "":
		return bad("map: sessname= is missing")
	case s.DevicePath == "":
		return bad("map: device_path= is missing")
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return bad("map: tls_cert and tls_key go together")
	}
	if s.TLS && s.Transport == "rdma" {
		return bad("map: tls is for transport=tcp; over RDMA use auth_key")
	}
	// No path= is fine for a session that exists (the kernel's rule): the
	// client daemon knows whether it does, and answers ENXIO if not.
	s.Mode, _ = rnbd.ParseAccessMode(s.AccessMode)
	return s, nil
}

// ParsePathArg parses one path, [src{@|,}]dst with addresses ip:ADDR (or
// plain), to port. Errors wrap EINVAL.
func ParsePathArg(v string, port int) (MapPath, error) {
	var src, dst string
	if i := strings.IndexAny(v, "@,"); i >= 0 {
		src, dst = v[:i], v[i+1:]
	} else {
		dst = v
	}
	p := MapPath{Port: port}
	for _, a := range []struct {
		in  string
		out *string
	}{{src, &p.Src}, {dst, &p.Dst}} {
		if a.in == "" {
			continue
		}
		addr := strings.TrimPrefix(a.in, "ip:")
		if strings.HasPrefix(a.in, "gid:") {
			return p, fmt.Errorf("map: path %q: GID addresses need RDMA: %w", v, unix.EINVAL)
		}
		if i := strings.IndexByte(addr, '%'); i >= 0 {
			addr = addr[:i]
		}
		if net.ParseIP(addr) == nil {
			return p, fmt.Errorf("map: path %q: %q is not an IP address: %w", v, a.in, unix.EINVAL)
		}
		*a.out = addr
	}
	if p.Dst == "" {
		return p, fmt.Errorf("map: path %q has no destination: %w", v, unix.EINVAL)
	}
	return p, nil
}
