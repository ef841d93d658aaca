package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/ublk"
)

// A mapped RNBD device outlives its client daemon: ublk user recovery keeps
// it, quiesced, with its I/O waiting, when the daemon dies. Each mapping is
// recorded under $URNBD_RUN_DIR/rnbd, and a daemon that starts serves the
// quiesced devices it finds recorded again (rnbd.Client.Recover): the
// session is dialled anew, the device reopened on the server, and the I/O
// that was in flight is issued again. A daemon that stops (SIGTERM) unmaps
// its devices instead.

// deviceRecord is what a daemon needs to recover a mapping: the map request.
type deviceRecord struct {
	Spec           mapSpec `json:"spec"`
	Queues         int     `json:"queues,omitempty"`
	SessionDevices int     `json:"session_devices,omitempty"`
}

// haveRecords reports whether mappings are recorded: a daemon that died
// left them, if none runs.
func haveRecords() bool {
	files, _ := filepath.Glob(filepath.Join(runDir(), "rnbd", "*.json"))
	return len(files) > 0
}

func recordPath(id uint32) string {
	return filepath.Join(runDir(), "rnbd", strconv.FormatUint(uint64(id), 10)+".json")
}

func (r *deviceRecord) save(id uint32) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(recordPath(id)), 0o700); err != nil {
		return err
	}
	tmp := recordPath(id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, recordPath(id))
}

// recoverDevices serves again the recorded devices that a daemon before
// this one left quiesced, and forgets the records of devices that are gone.
func (d *clientDaemon) recoverDevices() {
	files, _ := filepath.Glob(filepath.Join(runDir(), "rnbd", "*.json"))
	for _, f := range files {
		id64, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(f), ".json"), 10, 32)
		if err != nil {
			continue
		}
		id := uint32(id64)
		info, err := d.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) || (err == nil && info.State == ublk.StateDead) {
			os.Remove(f)
			continue
		}
		// Until the kernel notices its server's death, the device still
		// reads live, with that server's pid; Recover waits for it.
		if err != nil || !(info.State == ublk.StateQuiesced || (info.State == ublk.StateLive && !alive(int(info.ServerPID)))) {
			log.Printf("urnbd client daemon: %s is recorded but not waiting for recovery (%v, state %d, server pid %d): left alone", ublk.BlockPath(id), err, info.State, info.ServerPID)
			continue
		}
		if err := d.recoverDevice(id, f); err != nil {
			log.Printf("urnbd client daemon: recover %s: %v; trying again every %v (urnbd ublk del gives it up)", ublk.BlockPath(id), err, recoverRetry)
			go d.retryRecover(id, f)
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
func (d *clientDaemon) retryRecover(id uint32, file string) {
	last := ""
	for {
		select {
		case <-d.stopping:
			return
		case <-time.After(recoverRetry):
		}
		info, err := d.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) || (err == nil && info.State == ublk.StateDead) {
			os.Remove(file)
			log.Printf("urnbd client daemon: %s is gone; no longer recovering it", ublk.BlockPath(id))
			return
		}
		err = d.recoverDevice(id, file)
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

func (d *clientDaemon) recoverDevice(id uint32, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var rec deviceRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if rec.Spec.mode, err = rnbd.ParseAccessMode(rec.Spec.AccessMode); err != nil {
		return fmt.Errorf("%s: access mode %q: %w", file, rec.Spec.AccessMode, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := d.sessionFor(ctx, &rec)
	if err != nil {
		return err
	}
	dev, err := sess.client.Recover(ctx, d.ctrl, id, rec.Spec.DevicePath, rec.Spec.mode)
	for errors.Is(err, unix.EPERM) && ctx.Err() == nil {
		// The server still holds the dead daemon's session, and with it
		// the device's rw mapping, until it notices the loss.
		time.Sleep(time.Second)
		dev, err = sess.client.Recover(ctx, d.ctrl, id, rec.Spec.DevicePath, rec.Spec.mode)
	}
	if err != nil {
		d.dropIfUnused(sess)
		return err
	}
	d.addDevice(sess, &rec, dev)
	return nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	return pid > 0 && (unix.Kill(pid, 0) == nil || errors.Is(unix.Kill(pid, 0), unix.EPERM))
}
