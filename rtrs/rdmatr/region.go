package rdmatr

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/urnbd/urnbd/rdma"
)

// The client's region is registered with the device of every path, in
// parts (ClientConfig.RegionPartSize). A part is registered on every
// connection set of the session when RegisterPart asks for it, and on each
// set made later (a path added or reconnected) from then on; parts stay
// registered until the set goes. Registrations are made under Client.mu,
// which also guards the list of sets (Client.pcs), so a set that connects
// while a part is being registered gets it either way.

// regionAccess is what the device may do with the region: the client's
// sends read it, and the server RDMA-writes read data into it.
const regionAccess = rdma.AccessLocalWrite | rdma.AccessRemoteWrite

// splitRegion sets up the region's parts: of partSize bytes, or one for
// the whole region (registered from the start) if partSize is 0.
func (c *Client) splitRegion(partSize int) error {
	switch {
	case partSize < 0:
		return fmt.Errorf("rtrs/rdmatr: region part size %d: %w", partSize, syscall.EINVAL)
	case partSize == 0:
		c.partSize = max(len(c.region), 1)
		c.parts = make([]atomic.Bool, 1)
		c.parts[0].Store(true)
	default:
		c.partSize = partSize
		c.parts = make([]atomic.Bool, (len(c.region)+partSize-1)/partSize)
	}
	c.pcs = make(map[*pathConns]struct{})
	return nil
}

// RegionParts returns the number of parts of the region
// (ClientConfig.RegionPartSize).
func (c *Client) RegionParts() int { return len(c.parts) }

// RegisterPart registers part k of the region with the device of every
// path, now and after each reconnect, so that requests may carry data in
// it. It does nothing for a part already registered. A path that is going
// down when it is asked may miss it; its requests then fail over.
func (c *Client) RegisterPart(k int) error {
	if k < 0 || k >= len(c.parts) {
		return fmt.Errorf("rtrs/rdmatr: region part %d of %d: %w", k, len(c.parts), syscall.EINVAL)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parts[k].Load() {
		return nil
	}
	for pc := range c.pcs {
		if err := c.registerPart(pc, k); err != nil && !pc.failed.Load() {
			return err
		}
	}
	c.parts[k].Store(true)
	return nil
}

// registerParts registers the parts registered so far on a new set, and
// adds it to those that RegisterPart serves.
func (c *Client) registerParts(pc *pathConns) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc.partMR = make([]*rdma.MR, len(c.parts))
	for k := range c.parts {
		if c.parts[k].Load() {
			if err := c.registerPart(pc, k); err != nil {
				return err
			}
		}
	}
	c.pcs[pc] = struct{}{}
	return nil
}

func (c *Client) registerPart(pc *pathConns, k int) error {
	if pc.partMR[k] != nil {
		return nil
	}
	part := c.region[k*c.partSize : min((k+1)*c.partSize, len(c.region))]
	mr, err := pc.pd.RegMR(part, regionAccess)
	if err != nil {
		return fmt.Errorf("rtrs/rdmatr: register region part %d (%d bytes) on path %v: %w", k, len(part), pc.p.Addr(), err)
	}
	pc.partMR[k] = mr
	return nil
}

// forgetParts takes a set that is being destroyed from those that
// RegisterPart serves; its registrations are then the set's own to free.
func (c *Client) forgetParts(pc *pathConns) {
	c.mu.Lock()
	delete(c.pcs, pc)
	c.mu.Unlock()
}

// regionPart locates b in the region: its part k and its offset in the
// part. ok is false if b is not inside one registered part. Empty data
// needs no registration.
func (c *Client) regionPart(b []byte) (k, off int, ok bool) {
	if len(b) == 0 {
		return 0, 0, true
	}
	if len(c.region) == 0 {
		return 0, 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(c.region)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p-base >= uintptr(len(c.region)) || uintptr(len(b)) > uintptr(len(c.region))-(p-base) {
		return 0, 0, false
	}
	o := int(p - base)
	k = o / c.partSize
	off = o - k*c.partSize
	if off+len(b) > c.partSize {
		return k, off, false // straddles two parts
	}
	return k, off, c.parts[k].Load()
}
