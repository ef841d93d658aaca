package clientd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A mapped RNBD device outlives its client daemon: ublk user recovery keeps
// it, quiesced, with its I/O waiting, when the daemon dies. Each mapping is
// recorded, and a daemon that starts serves the quiesced devices it finds
// recorded again (rnbd.Client.Recover): the session is dialled anew, the
// device reopened on the server, and the I/O that was in flight is issued
// again. A daemon that stops (SIGTERM) unmaps its devices instead.

// Record is what a daemon needs to recover a mapping: the map request.
type Record struct {
	Spec           MapSpec `json:"spec"`
	Queues         int     `json:"queues,omitempty"`
	SessionDevices int     `json:"session_devices,omitempty"`
	// ZeroCopy is map --zero-copy (rnbd.MapOptions.ZeroCopy).
	ZeroCopy bool `json:"zero_copy,omitempty"`
}

// Records are the records of a daemon's mappings, one file per ublk
// device id in Dir.
type Records struct{ Dir string }

// path returns the record file of device id.
func (r Records) path(id uint32) string {
	return filepath.Join(r.Dir, strconv.FormatUint(uint64(id), 10)+".json")
}

// Save records device id's mapping; a crash leaves the old record or the
// new one, never a torn one.
func (r Records) Save(id uint32, rec *Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return err
	}
	tmp := r.path(id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.path(id))
}

// Load reads device id's record and checks it.
func (r Records) Load(id uint32) (*Record, error) {
	file := r.path(id)
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := rec.Spec.CheckMode(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &rec, nil
}

// Remove forgets device id's record.
func (r Records) Remove(id uint32) error {
	if err := os.Remove(r.path(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// IDs returns the device ids that have records.
func (r Records) IDs() []uint32 {
	files, _ := filepath.Glob(filepath.Join(r.Dir, "*.json"))
	var ids []uint32
	for _, f := range files {
		id, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(f), ".json"), 10, 32)
		if err == nil {
			ids = append(ids, uint32(id))
		}
	}
	return ids
}

// Any reports whether mappings are recorded: a daemon that died left
// them, if none runs.
func (r Records) Any() bool { return len(r.IDs()) > 0 }
