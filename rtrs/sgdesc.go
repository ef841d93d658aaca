package rtrs

import "encoding/binary"

// SGDesc is rtrs_sg_desc (16 bytes), the description of a remote memory
// region:
//
//	off 0  le64 addr  remote virtual address (IOVA of the MR)
//	off 8  le32 key   rkey of the MR
//	off 12 le32 len   length in bytes
type SGDesc struct {
	// Addr is the remote (IO) virtual address of the region.
	Addr uint64
	// Key is the rkey that grants remote access to the region.
	Key uint32
	// Len is the length of the region in bytes.
	Len uint32
}

// Size returns SGDescSize.
func (d *SGDesc) Size() int { return SGDescSize }

// MarshalTo writes the 16-byte descriptor to b and returns 16.
func (d *SGDesc) MarshalTo(b []byte) (int, error) {
	if len(b) < SGDescSize {
		return 0, errShortBuffer("sg_desc", len(b), SGDescSize)
	}
	d.put(b)
	return SGDescSize, nil
}

// Unmarshal reads a descriptor from the first 16 bytes of b. Any value is
// accepted; the messages that carry descriptors check their lengths.
func (d *SGDesc) Unmarshal(b []byte) error {
	if len(b) < SGDescSize {
		return errTruncated("sg_desc", len(b), SGDescSize)
	}
	d.get(b)
	return nil
}

func (d *SGDesc) put(b []byte) {
	_ = b[15]
	binary.LittleEndian.PutUint64(b[0:], d.Addr)
	binary.LittleEndian.PutUint32(b[8:], d.Key)
	binary.LittleEndian.PutUint32(b[12:], d.Len)
}

func (d *SGDesc) get(b []byte) {
	_ = b[15]
	d.Addr = binary.LittleEndian.Uint64(b[0:])
	d.Key = binary.LittleEndian.Uint32(b[8:])
	d.Len = binary.LittleEndian.Uint32(b[12:])
}

// SGDescs is a read-only view of consecutive wire descriptors (a byte slice
// whose length is a multiple of SGDescSize), as returned by ParseIOReq. It
// lets a receiver read descriptors in place, without allocating.
type SGDescs []byte

// Len returns the number of descriptors.
func (s SGDescs) Len() int { return len(s) / SGDescSize }

// At returns descriptor i; it panics if i is not in 0..Len()-1, like a slice
// index.
func (s SGDescs) At(i int) SGDesc {
	var d SGDesc
	d.get(s[i*SGDescSize : (i+1)*SGDescSize])
	return d
}

// AppendTo appends all descriptors to dst and returns the extended slice.
func (s SGDescs) AppendTo(dst []SGDesc) []SGDesc {
	for i := 0; i < s.Len(); i++ {
		dst = append(dst, s.At(i))
	}
	return dst
}

// getDescs decodes n descriptors from b (which must hold them) into dst,
// reusing its capacity.
func getDescs(dst []SGDesc, b []byte, n int) []SGDesc {
	if cap(dst) < n {
		dst = make([]SGDesc, n)
	}
	dst = dst[:n]
	for i := range dst {
		dst[i].get(b[i*SGDescSize:])
	}
	return dst
}

// putDescs encodes descs into b, which must be large enough.
func putDescs(b []byte, descs []SGDesc) {
	for i := range descs {
		descs[i].put(b[i*SGDescSize:])
	}
}
