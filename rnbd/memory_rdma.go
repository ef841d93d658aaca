package rnbd

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/urnbd/urnbd/rtrs/rdmatr"
)

// RDMA sessions have one memory region for everything their requests
// carry: a part per device (block) for the tag buffers of up to
// maxDevices mapped devices (each with up to rdmaMaxDepth tags of up to
// rdmaMaxTagBytes per queue), and a last part, a page, for admin answers.
// Registered memory is pinned: a block's part is registered when a device
// first takes the block (and then stays registered while the session
// lives, as the server may still write into it after an unmap), so a
// session pins only what its devices use.
const (
	rdmaMaxDepth    = 128
	rdmaMaxTagBytes = 128 << 10
	rdmaAdminBytes  = 4096
)

// regionMemory is the registered region of an RDMA session, in parts.
type regionMemory struct {
	c          *rdmatr.Client
	slot       int // bytes of tag buffers per device
	maxDevices int
	admin      sync.Mutex // the admin part: one answer at a time
}

// fits checks that a device's tag buffers fit its part.
func (m *regionMemory) fits(size int) error {
	if size > m.slot {
		return fmt.Errorf("rnbd: %d bytes of tag buffers, an RDMA session holds %d per device (depth at most %d): %w", size, m.slot, rdmaMaxDepth, syscall.ENOMEM)
	}
	return nil
}

// part registers block's part of the region and returns it.
func (m *regionMemory) part(block int) ([]byte, error) {
	if err := m.c.RegisterPart(block); err != nil {
		return nil, fmt.Errorf("rnbd: tag buffers of %d bytes: %w", m.slot, err)
	}
	off := block * m.slot
	return m.c.Region()[off : off+m.slot : off+m.slot], nil
}

// adminBuffer takes the admin answers' buffer, n bytes, until unlock.
func (m *regionMemory) adminBuffer(n int) (unlock func(), buf []byte, err error) {
	if n > rdmaAdminBytes {
		return nil, nil, fmt.Errorf("rnbd: admin answer of %d bytes: %w", n, syscall.EINVAL)
	}
	m.admin.Lock()
	if n > 0 {
		buf = m.c.Region()[m.maxDevices*m.slot:][:n]
	}
	return m.admin.Unlock, buf, nil
}
