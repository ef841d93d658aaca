package clientd

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
)

// RecoverRecorded serves again the recorded devices that a daemon before
// this one left quiesced, and forgets the records of devices that are
// gone. A recovery that fails (the server is down too, say) is tried
// again every RecoverRetry in the background until it works, the device
// is gone, or stop is closed.
func (r *Registry) RecoverRecorded(stop <-chan struct{}) {
	for _, id := range r.records.IDs() {
		info, err := r.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) || (err == nil && info.State == ublk.StateDead) {
			r.records.Remove(id)
			continue
		}
		// Until the kernel notices its server's death, the device still
		// reads live, with that server's pid; Recover waits for it.
		if err != nil || !(info.State == ublk.StateQuiesced || (info.State == ublk.StateLive && !alive(int(info.ServerPID)))) {
			r.logf("%s is recorded but not waiting for recovery (%v, state %d, server pid %d): left alone", ublk.BlockPath(id), err, info.State, info.ServerPID)
			continue
		}
		if err := r.Recover(context.Background(), id); err != nil {
			r.logf("recover %s: %v; trying again every %v (urnbd ublk del gives it up)", ublk.BlockPath(id), err, RecoverRetry)
			go r.retryRecover(id, stop)
			continue
		}
		r.logf("recovered %s", ublk.BlockPath(id))
	}
}

// RecoverRetry is how often a recovery that failed is tried again.
const RecoverRetry = 2 * time.Second

// retryRecover tries to recover device id until it works, the device is
// gone or stop is closed.
func (r *Registry) retryRecover(id uint32, stop <-chan struct{}) {
	last := ""
	for {
		select {
		case <-stop:
			return
		case <-time.After(RecoverRetry):
		}
		info, err := r.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) || (err == nil && info.State == ublk.StateDead) {
			r.records.Remove(id)
			r.logf("%s is gone; no longer recovering it", ublk.BlockPath(id))
			return
		}
		err = r.Recover(context.Background(), id)
		if err == nil {
			r.logf("recovered %s", ublk.BlockPath(id))
			return
		}
		if err.Error() != last {
			last = err.Error()
			r.logf("recover %s: %v; trying again", ublk.BlockPath(id), err)
		}
	}
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	return pid > 0 && (unix.Kill(pid, 0) == nil || errors.Is(unix.Kill(pid, 0), unix.EPERM))
}
