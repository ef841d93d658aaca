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
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
)

// A handover of a local ublk device: `urnbd ublk handover ID` writes a
// handoverRecord with its timeout next to the device's record and sends
// the device's server handoverSignal; the server hands the device over
// (ublk.Device.Handover), writes the outcome into the record and exits with
// handoverExit; the command then starts the next server (`ublk recover`).
// A signal, not a socket: each device has its own server process, and one
// that a kill -9 left behind is served again the same way.

// handoverSignal asks a device's server to hand it over.
const handoverSignal = unix.SIGUSR1

// defaultHandoverTimeout is the server's wait for its requests in flight
// when the record gives none.
const defaultHandoverTimeout = 30 * time.Second

// handoverRecord is the request of a handover and, once Done, its outcome.
type handoverRecord struct {
	TimeoutMS int64 `json:"timeout_ms"`
	Done      bool  `json:"done,omitempty"`
	// Refused: the server did not hand the device over and still serves
	// it (Error says why).
	Refused      bool   `json:"refused,omitempty"`
	Quiesced     bool   `json:"quiesced,omitempty"`
	QuiesceError string `json:"quiesce_error,omitempty"`
	Error        string `json:"error,omitempty"`
}

func handoverPath(id uint32) string {
	return filepath.Join(runDir(), "ublk", strconv.FormatUint(uint64(id), 10)+".handover.json")
}

func (r *handoverRecord) save(id uint32) error {
	b, _ := json.Marshal(r)
	tmp := handoverPath(id) + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, handoverPath(id))
}

func loadHandover(id uint32) (*handoverRecord, error) {
	b, err := os.ReadFile(handoverPath(id))
	if err != nil {
		return nil, err
	}
	var r handoverRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", handoverPath(id), err)
	}
	return &r, nil
}

func ublkHandoverCommand() *cli.Command {
	return &cli.Command{
		Name: "handover",
		Usage: "replace the server of a device (after an upgrade of urnbd, say) without deleting it: the " +
			"device waits with its I/O, and the next server serves it again",
		ArgsUsage: "ID",
		Description: "The device's server lets the requests its target holds finish, leaves the device to the\n" +
			"next server and exits with status 75; the I/O that arrives meanwhile waits in the kernel (ublk\n" +
			"user recovery) and nothing is issued twice. Then this command starts the next server (the urnbd\n" +
			"binary on disk now, as `urnbd ublk recover ID`) and says how the device went. Requests still\n" +
			"with the target after --timeout are issued again to the next server, as after a crash. A device\n" +
			"added with --no-recovery cannot be handed over (EOPNOTSUPP) and stays with its server.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "timeout", Value: defaultHandoverTimeout, Usage: "how long the server waits for the requests in flight"},
			&cli.BoolFlag{Name: "no-start", Usage: "do not start the next server (serve the device later with `urnbd ublk recover ID`)"},
		},
		Action: handoverDevice,
	}
}

func handoverDevice(c *cli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("handover: want one device ID: %w", unix.EINVAL)
	}
	id, err := parseID(c.Args().First())
	if err != nil {
		return err
	}
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return fmt.Errorf("handover: --timeout %v: want a positive duration: %w", timeout, unix.EINVAL)
	}
	var info ublk.DevInfo
	if err := withControl(func(ctrl *ublk.Control) (err error) { info, err = ctrl.DevInfo(id); return err }); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("handover: device %d does not exist: %w", id, unix.ENODEV)
		}
		return fmt.Errorf("handover: device %d: %w", id, err)
	}
	if info.Flags&ublk.FlagUserRecovery == 0 {
		return fmt.Errorf("handover: device %d was added with --no-recovery; it cannot outlive its server: %w", id, unix.EOPNOTSUPP)
	}
	spec, err := loadSpec(id)
	if err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	if info.State != ublk.StateLive || spec.PID <= 0 || unix.Kill(spec.PID, 0) != nil {
		return fmt.Errorf("handover: no server serves device %d (%s); serve it again with `urnbd ublk recover %d`: %w",
			id, ublk.StateName(info.State), id, unix.ENOENT)
	}
	os.Remove(handoverPath(id))
	if err := (&handoverRecord{TimeoutMS: timeout.Milliseconds()}).save(id); err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	defer os.Remove(handoverPath(id))
	if err := unix.Kill(spec.PID, handoverSignal); err != nil {
		return fmt.Errorf("handover: signal the server (pid %d): %w", spec.PID, err)
	}
	// The server writes the outcome, then exits; both within its timeout
	// and the time to end its queues.
	var rec *handoverRecord
	exited := false
	for deadline := time.Now().Add(timeout + 10*time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r, err := loadHandover(id); err == nil && r.Done {
			rec = r
		}
		if exited = unix.Kill(spec.PID, 0) != nil; exited || (rec != nil && rec.Refused) {
			break
		}
	}
	dev := ublk.BlockPath(id)
	switch {
	case rec != nil && rec.Refused:
		return fmt.Errorf("handover: %s: the server (pid %d) refused and still serves it: %s: %w", dev, spec.PID, rec.Error, unix.EOPNOTSUPP)
	case !exited:
		return fmt.Errorf("handover: %s: the server (pid %d) has not exited; see %s: %w", dev, spec.PID, daemonLog(), unix.ETIMEDOUT)
	case rec == nil:
		// It died without saying how; the kernel issues its requests
		// again to the next server, as after a crash.
		fmt.Printf("%s: left to the next server; its server (pid %d) exited without handing it over (see %s)\n", dev, spec.PID, daemonLog())
	default:
		how := "the queues held back new requests"
		if rec.Quiesced {
			how = "the ublk driver quiesced it"
		} else if rec.QuiesceError != "" {
			how += " (quiesce failed: " + rec.QuiesceError + ")"
		}
		if rec.Error != "" {
			fmt.Printf("%s: left to the next server; %s, but %s\n", dev, how, rec.Error)
		} else {
			fmt.Printf("%s: handed over (%s)\n", dev, how)
		}
	}
	if !c.Bool("no-start") {
		if err := daemonize("ublk", "recover", strconv.FormatUint(uint64(id), 10)); err != nil {
			return fmt.Errorf("handover: start the next server: %w", err)
		}
		next, err := loadSpec(id)
		if err != nil {
			return fmt.Errorf("handover: the next server: %w", err)
		}
		fmt.Printf("%s: served by the next server (pid %d)\n", dev, next.PID)
	}
	if rec != nil && rec.Error != "" {
		return fmt.Errorf("handover: %s had requests in flight at the timeout; they are issued again: %w", dev, unix.ETIMEDOUT)
	}
	return nil
}

// handOver is the server's side: it hands dev over as the record of the
// request says and records the outcome. It reports whether the device has
// left this server, which then exits; a refusal leaves it serving.
func handOver(dev *ublk.Device) bool {
	id := dev.ID()
	rec, err := loadHandover(id)
	if err != nil {
		// Signalled by hand (kill -USR1): the default timeout.
		rec = &handoverRecord{TimeoutMS: defaultHandoverTimeout.Milliseconds()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rec.TimeoutMS)*time.Millisecond)
	defer cancel()
	res, err := dev.Handover(ctx)
	rec.Done, rec.Quiesced = true, res.Quiesced
	if res.QuiesceErr != nil {
		rec.QuiesceError = res.QuiesceErr.Error()
	}
	if err != nil {
		rec.Error = err.Error()
		rec.Refused = !errors.Is(err, unix.ETIMEDOUT)
	}
	if serr := rec.save(id); serr != nil {
		log.Printf("urnbd ublk: device %d: record the handover: %v", id, serr)
	}
	if rec.Refused {
		log.Printf("urnbd ublk: device %d: handover refused, still serving: %v", id, err)
		return false
	}
	if err == nil {
		// The queues have ended; a queue error here is the queue's own.
		if werr := dev.Wait(); werr != nil {
			log.Printf("urnbd ublk: device %d: after the handover: %v", id, werr)
		}
	}
	log.Printf("urnbd ublk: device %d handed over (quiesced: %v); the next server recovers it", id, res.Quiesced)
	return true
}
