package main

import (
	"context"
	"errors"
	"log"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
)

// A daemon that starts serves again the devices that a daemon before it
// left quiesced when it died (clientd.Records has the whole story).

// recoverDevices serves again the recorded devices that a daemon before
// this one left quiesced, and forgets the records of devices that are gone.
func (d *clientDaemon) recoverDevices() {
	recs := records()
	for _, id := range recs.IDs() {
		info, err := d.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) || (err == nil && info.State == ublk.StateDead) {
			recs.Remove(id)
			continue
		}
		// Until the kernel notices its server's death, the device still
		// reads live, with that server's pid; Recover waits for it.
		if err != nil || !(info.State == ublk.StateQuiesced || (info.State == ublk.StateLive && !alive(int(info.ServerPID)))) {
			log.Printf("urnbd client daemon: %s is recorded but not waiting for recovery (%v, state %d, server pid %d): left alone", ublk.BlockPath(id), err, info.State, info.ServerPID)
			continue
		}
		if err := d.recoverDevice(id); err != nil {
			log.Printf("urnbd client daemon: recover %s: %v; trying again every %v (urnbd ublk del gives it up)", ublk.BlockPath(id), err, recoverRetry)
			go d.retryRecover(id)
			continue
		}
		log.Printf("urnbd client daemon: recovered %s", ublk.BlockPath(id))
	}
}

// recoverRetry is how often a recovery that failed (the server down too,
// say) is tried again.
const recoverRetry = 2 * time.Second

// retryRecover tries to recover device id until it works, the device is
// gone or the daemon stops.
func (d *clientDaemon) retryRecover(id uint32) {
	last := ""
	for {
		select {
		case <-d.stopping:
			return
		case <-time.After(recoverRetry):
		}
		info, err := d.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) || (err == nil && info.State == ublk.StateDead) {
			records().Remove(id)
			log.Printf("urnbd client daemon: %s is gone; no longer recovering it", ublk.BlockPath(id))
			return
		}
		err = d.recoverDevice(id)
		if err == nil {
			log.Printf("urnbd client daemon: recovered %s", ublk.BlockPath(id))
			return
		}
		if err.Error() != last {
			last = err.Error()
			log.Printf("urnbd client daemon: recover %s: %v; trying again", ublk.BlockPath(id), err)
		}
	}
}

func (d *clientDaemon) recoverDevice(id uint32) error {
	rec, err := records().Load(id)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := d.sessionFor(ctx, rec)
	if err != nil {
		return err
	}
	dev, err := sess.client.Recover(ctx, d.ctrl, id, rec.Spec.DevicePath, rec.Spec.Mode)
	for errors.Is(err, unix.EPERM) && ctx.Err() == nil {
		// The server still holds the dead daemon's session, and with it
		// the device's rw mapping, until it notices the loss.
		time.Sleep(time.Second)
		dev, err = sess.client.Recover(ctx, d.ctrl, id, rec.Spec.DevicePath, rec.Spec.Mode)
	}
	if err != nil {
		d.dropIfUnused(sess)
		return err
	}
	d.addDevice(sess, rec, dev)
	return nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	return pid > 0 && (unix.Kill(pid, 0) == nil || errors.Is(unix.Kill(pid, 0), unix.EPERM))
}
