package rdma

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"
)

// Sizes of the Linux socket addresses that RDMA CM takes.
const (
	sizeofSockaddrInet4 = 16
	sizeofSockaddrInet6 = 28
)

// putSockaddr writes ap as a Linux struct sockaddr_in (IPv4, including
// IPv4-mapped IPv6 addresses) or sockaddr_in6 into b, which must hold at
// least 28 bytes, and returns its length. The family is in host byte
// order, the port in network byte order. An IPv6 zone is either an
// interface name or a numeric scope id.
func putSockaddr(b []byte, ap netip.AddrPort) (int, error) {
	a := ap.Addr()
	if !a.IsValid() {
		return 0, fmt.Errorf("rdma: invalid address %v", ap)
	}
	clear(b[:sizeofSockaddrInet6])
	if a.Is4() || a.Is4In6() {
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
		binary.BigEndian.PutUint16(b[2:], ap.Port())
		v4 := a.Unmap().As4()
		copy(b[4:8], v4[:])
		return sizeofSockaddrInet4, nil
	}
	binary.NativeEndian.PutUint16(b[0:], unix.AF_INET6)
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	v6 := a.As16()
	copy(b[8:24], v6[:])
	if z := a.Zone(); z != "" {
		id, err := zoneIndex(z)
		if err != nil {
			return 0, err
		}
		binary.NativeEndian.PutUint32(b[24:], id)
	}
	return sizeofSockaddrInet6, nil
}

func zoneIndex(z string) (uint32, error) {
	if n, err := strconv.ParseUint(z, 10, 32); err == nil {
		return uint32(n), nil
	}
	ifi, err := net.InterfaceByName(z)
	if err != nil {
		return 0, fmt.Errorf("rdma: IPv6 zone %q: %w", z, err)
	}
	return uint32(ifi.Index), nil
}

// parseSockaddr reads a Linux sockaddr_in or sockaddr_in6 from b. A zero
// family gives the zero AddrPort and no error (an unset address).
func parseSockaddr(b []byte) (netip.AddrPort, error) {
	if len(b) < 2 {
		return netip.AddrPort{}, fmt.Errorf("rdma: sockaddr of %d bytes", len(b))
	}
	switch fam := binary.NativeEndian.Uint16(b); fam {
	case 0:
		return netip.AddrPort{}, nil
	case unix.AF_INET:
		if len(b) < sizeofSockaddrInet4 {
			return netip.AddrPort{}, fmt.Errorf("rdma: sockaddr_in of %d bytes", len(b))
		}
		a := netip.AddrFrom4([4]byte(b[4:8]))
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[2:])), nil
	case unix.AF_INET6:
		if len(b) < sizeofSockaddrInet6 {
			return netip.AddrPort{}, fmt.Errorf("rdma: sockaddr_in6 of %d bytes", len(b))
		}
		a := netip.AddrFrom16([16]byte(b[8:24]))
		if id := binary.NativeEndian.Uint32(b[24:]); id != 0 {
			a = a.WithZone(strconv.FormatUint(uint64(id), 10))
		}
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[2:])), nil
	default:
		return netip.AddrPort{}, fmt.Errorf("rdma: unsupported address family %d", fam)
	}
}
