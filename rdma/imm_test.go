package rdma

import (
	"encoding/binary"
	"testing"
)

func TestImmByteOrder(t *testing.T) {
	for _, v := range []uint32{0, 1, 0x12345678, 0xdeadbeef, 0xffffffff, 0x80000000} {
		w := ImmToWire(v)
		if got := htonl(v); w != got {
			t.Errorf("ImmToWire(%#x) = %#x, C htonl = %#x", v, w, got)
		}
		// On the wire (the bytes of the __be32 in memory) the value is
		// big-endian, as the kernel's cpu_to_be32 makes it.
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], w)
		if got := binary.BigEndian.Uint32(b[:]); got != v {
			t.Errorf("wire bytes of %#x are % x", v, b)
		}
		if back := ImmFromWire(w); back != v {
			t.Errorf("ImmFromWire(ImmToWire(%#x)) = %#x", v, back)
		}
	}
}
