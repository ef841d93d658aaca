package rnbd

import (
	"context"
	"fmt"
	"syscall"

	"github.com/urnbd/urnbd/ublk"
)

// Resize sets the size of the mapped device to the server's geometry: it
// opens the device again on its session, which both the kernel's server
// and ours answer with the device's id and its size now (a repeated open
// by the same session opens nothing new), and sets the local device's size
// to size bytes, or to the server's size when size is 0. It returns the
// size set.
//
// A size beyond the server's device fails with EINVAL, as does an answer
// with another device id or block size (the server's device is not the one
// mapped). The ublk driver must be able to resize a started device
// (update_size, Linux 7.x): on 6.12 Resize fails with EOPNOTSUPP before
// asking the server.
func (d *Device) Resize(ctx context.Context, size uint64) (uint64, error) {
	d.mu.Lock() // no reopen meanwhile: it reads geo
	defer d.mu.Unlock()
	if d.unmapped || d.dev == nil {
		return 0, fmt.Errorf("rnbd: resize %s: not mapped: %w", d.name, syscall.ENODEV)
	}
	path := ublk.BlockPath(d.dev.ID())
	if d.dev.Info().Flags&ublk.FlagUpdateSize == 0 {
		return 0, fmt.Errorf("rnbd: resize %s: this kernel's ublk driver cannot resize a started device (no update_size; Linux 7.x has it): %w", path, syscall.EOPNOTSUPP)
	}
	if !d.Open() {
		return 0, fmt.Errorf("rnbd: resize %s: the device is not open on the server (its session is down or the server refused it): %w", path, syscall.ENOTCONN)
	}
	rsp, err := d.sendOpen(ctx)
	if err != nil {
		return 0, fmt.Errorf("rnbd: resize %s: %w", path, err)
	}
	if rsp.DeviceID != d.id.Load() || rsp.LogicalBlockSize != d.geo.LogicalBlockSize {
		return 0, fmt.Errorf("rnbd: resize %s: the server answered device %d with %d-byte blocks, mapped as device %d with %d-byte blocks: %w",
			path, rsp.DeviceID, rsp.LogicalBlockSize, d.id.Load(), d.geo.LogicalBlockSize, syscall.EINVAL)
	}
	server := rsp.NSectors << 9
	switch {
	case size == 0:
		size = server
	case size > server:
		return 0, fmt.Errorf("rnbd: resize %s: %d bytes is beyond %s on the server (%d bytes): %w", path, size, d.name, server, syscall.EINVAL)
	}
	if err := d.dev.Resize(size); err != nil {
		return 0, fmt.Errorf("rnbd: resize %s: %w", path, err)
	}
	// What a reopen after a reconnect compares against, and a recovery.
	d.geo.NSectors = rsp.NSectors
	return size, nil
}
