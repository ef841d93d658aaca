package rnbd

import (
	"context"

	"github.com/urnbd/urnbd/ublk"
)

// Handover ends this client's service of the mapping and leaves its local
// device to a later client (Client.Recover), which maps devName again: the
// ublk device stays, its I/O waits (ublk.Device.Handover). Once the
// requests the device had sent to the server have their answers, it is
// closed on the server, so the next client's open is not refused as a
// second writer. If ctx ends first, the error says so and the device stays
// open on the server with those requests; the kernel issues them again to
// the next client once this process is gone.
func (d *Device) Handover(ctx context.Context) (ublk.HandoverResult, error) {
	d.detach()
	res, err := d.dev.Handover(ctx)
	if err != nil {
		return res, err
	}
	d.c.t.release(d.block)
	return res, d.close(ctx)
}
