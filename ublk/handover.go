package ublk

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// A handover ends this process's service of a device without ending the
// device: the block device stays, its I/O waits in the kernel, and a later
// server takes it over with Recover (ublk user recovery), as after a crash
// but without issuing anything twice. Every request the target was handed
// completes first; the requests it was not handed wait for the next server.
//
// Where the driver has FlagQuiesce (7.3 has it, 6.12 not) and the device
// runs the per-tag protocol, QUIESCE_DEV stops the driver from handing out
// requests and cancels the queues' idle fetches. Otherwise (6.12, a device
// that an older urnbd created, or batch I/O) each queue keeps the requests
// that still arrive without serving them. Not QUIESCE_DEV with batch I/O:
// 7.3 cancels a batch queue there the way it does for a device being
// removed (it sets the queue's force_abort), and the requests that arrive
// until the next server fail with EIO instead of waiting (TestLabHandover
// shows it).
//
// Either way a queue ends once the requests it handed to its target have
// completed and their results are committed, and its thread exits with the
// ring open, as a dead server's would: the kernel's exit path cancels the
// queue's commands, quiesces the device and requeues the requests held
// back for the next server (FlagUserRecoveryReissue).

// QuiesceTimeout bounds the driver's wait in QUIESCE_DEV for every queue to
// have a request slot idle (one that no request of the server holds).
const QuiesceTimeout = 10 * time.Second

// QuiesceDev stops device id from handing out requests and cancels its
// queues' idle fetches, after waiting up to timeout (0: for ever) for each
// queue to have one (EBUSY if one does not); other commands of c wait
// meanwhile. The device must have been
// created with FlagQuiesce (EOPNOTSUPP otherwise). The driver does not
// undo it: the device's requests wait for a new server from then on, even
// if it fails.
func (c *Control) QuiesceDev(id uint32, timeout time.Duration) error {
	_, err := c.do("QUIESCE_DEV", opQuiesceDev, &CtrlCmd{DevID: id, QueueID: ^uint16(0), Data: uint64(timeout.Milliseconds())}, nil, 0)
	return err
}

// HandoverResult says how a handover went.
type HandoverResult struct {
	// Quiesced: the driver stopped handing out requests (QUIESCE_DEV);
	// otherwise the queues held back what arrived.
	Quiesced bool
	// QuiesceErr is why QUIESCE_DEV failed, if it did; the queues then
	// held back what arrived.
	QuiesceErr error
}

// Handover ends the device's service by this process and leaves the
// device to a later server (Recover): it waits until the requests handed
// to the target have completed and every queue has ended, or until ctx is
// done. Then it fails with ETIMEDOUT, naming how many requests the target
// still holds; the queues go on finishing them, and those that the process
// does not finish before it exits are issued again to the next server.
// The device must have user recovery (EOPNOTSUPP otherwise: it would be
// deleted when its server goes).
func (d *Device) Handover(ctx context.Context) (HandoverResult, error) {
	var res HandoverResult
	id := d.info.DevID
	if d.info.Flags&FlagUserRecovery == 0 {
		return res, fmt.Errorf("ublk device %d has no user recovery; it cannot outlive its server: %w", id, unix.EOPNOTSUPP)
	}
	if d.info.Flags&FlagQuiesce != 0 && d.info.Flags&FlagBatchIO == 0 {
		// Before the queues hold back anything: the driver waits for
		// each queue to have a slot idle, which a held one is not.
		if err := d.ctrl.QuiesceDev(id, QuiesceTimeout); err != nil {
			res.QuiesceErr = err
		} else {
			res.Quiesced = true
		}
	}
	d.mu.Lock()
	if !d.released {
		for _, q := range d.queues {
			q.startDrain()
		}
	}
	d.mu.Unlock()
	select {
	case <-d.done:
		return res, nil
	case <-ctx.Done():
	}
	left := 0
	for _, q := range d.queues {
		left += int(q.drainLeft.Load())
	}
	return res, fmt.Errorf("ublk device %d: %d requests still with the target after %v: %w", id, left, context.Cause(ctx), unix.ETIMEDOUT)
}

// startDrain tells the queue's loop to drain, from another thread, and
// wakes it; under the device's lock, before release.
func (q *Queue) startDrain() {
	q.drainLeft.Store(-1)
	q.draining.Store(true)
	one := [8]byte{1}
	unix.Write(q.wakeFd, one[:])
}

// drainDone reports, on the queue's thread, whether a draining queue has
// nothing left with its target and no commit in flight. It publishes how
// many requests it still holds for Handover's error.
func (q *Queue) drainDone() bool {
	left := q.handed
	if b := q.batch; b != nil {
		left += b.pending + b.inflight
	}
	q.drainLeft.Store(int32(left))
	return left == 0
}
