package rdma

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSockaddrInet4(t *testing.T) {
	b := make([]byte, 128)
	n, err := putSockaddr(b, netip.MustParseAddrPort("192.0.2.1:4791"))
	if err != nil || n != 16 {
		t.Fatalf("putSockaddr: %d, %v", n, err)
	}
	want := make([]byte, 16)
	binary.NativeEndian.PutUint16(want, unix.AF_INET)
	copy(want[2:], []byte{0x12, 0xb7, 192, 0, 2, 1})
	if !bytes.Equal(b[:16], want) {
		t.Fatalf("sockaddr_in % x, want % x", b[:16], want)
	}
	ap, err := parseSockaddr(b)
	if err != nil || ap != netip.MustParseAddrPort("192.0.2.1:4791") {
		t.Fatalf("parseSockaddr: %v, %v", ap, err)
	}
	// An IPv4-mapped IPv6 address becomes a sockaddr_in.
	if n, _ := putSockaddr(b, netip.MustParseAddrPort("[::ffff:192.0.2.2]:1")); n != 16 {
		t.Fatalf("v4-mapped: length %d", n)
	}
	if ap, _ := parseSockaddr(b); ap.String() != "192.0.2.2:1" {
		t.Fatalf("v4-mapped: %v", ap)
	}
}

func TestSockaddrInet6(t *testing.T) {
	b := make([]byte, 28)
	n, err := putSockaddr(b, netip.MustParseAddrPort("[2001:db8::1%7]:1234"))
	if err != nil || n != 28 {
		t.Fatalf("putSockaddr: %d, %v", n, err)
	}
	if fam := binary.NativeEndian.Uint16(b); fam != unix.AF_INET6 {
		t.Fatalf("family %d", fam)
	}
	if port := binary.BigEndian.Uint16(b[2:]); port != 1234 {
		t.Fatalf("port %d", port)
	}
	if scope := binary.NativeEndian.Uint32(b[24:]); scope != 7 {
		t.Fatalf("scope %d", scope)
	}
	if !bytes.Equal(b[8:10], []byte{0x20, 0x01}) || b[23] != 1 {
		t.Fatalf("address bytes % x", b[8:24])
	}
	ap, err := parseSockaddr(b)
	if err != nil || ap.String() != "[2001:db8::1%7]:1234" {
		t.Fatalf("parseSockaddr: %v, %v", ap, err)
	}
}

func TestSockaddrErrors(t *testing.T) {
	b := make([]byte, 28)
	if _, err := putSockaddr(b, netip.AddrPort{}); err == nil {
		t.Error("putSockaddr of the zero AddrPort succeeded")
	}
	if _, err := putSockaddr(b, netip.MustParseAddrPort("[fe80::1%no-such-if0]:1")); err == nil {
		t.Error("unknown zone accepted")
	}
	clear(b)
	if ap, err := parseSockaddr(b); err != nil || ap.IsValid() {
		t.Errorf("unset sockaddr: %v, %v", ap, err)
	}
	binary.NativeEndian.PutUint16(b, unix.AF_UNIX)
	if _, err := parseSockaddr(b); err == nil {
		t.Error("AF_UNIX accepted")
	}
	binary.NativeEndian.PutUint16(b, unix.AF_INET6)
	if _, err := parseSockaddr(b[:16]); err == nil {
		t.Error("short sockaddr_in6 accepted")
	}
	if _, err := parseSockaddr(b[:1]); err == nil {
		t.Error("1-byte sockaddr accepted")
	}
}
