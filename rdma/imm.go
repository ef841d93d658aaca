package rdma

import "encoding/binary"

// Immediate data byte order.
//
// The verbs API carries immediate data as a __be32: the four bytes go on the
// wire as they lie in memory. The kernel's RTRS writes imm_data =
// cpu_to_be32(value) and reads be32_to_cpu(wc->ex.imm_data), so on the wire
// the value is big-endian. This package does the same conversion for you:
// SendWR.Imm and WC.Imm are host-order values, converted with htonl when a
// WRITE_WITH_IMM or SEND_WITH_IMM is posted and with ntohl when a completion
// carrying immediate data is polled. Peers therefore agree with the kernel
// on the value, whatever the endianness of either host.

// ImmToWire returns the __be32 bit pattern, as a native uint32, that
// carries the host value v on the wire (what htonl(v) returns).
func ImmToWire(v uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return binary.NativeEndian.Uint32(b[:])
}

// ImmFromWire is the inverse of ImmToWire (what ntohl(w) returns).
func ImmFromWire(w uint32) uint32 {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], w)
	return binary.BigEndian.Uint32(b[:])
}
