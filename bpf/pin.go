//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where urnbd pins its maps, in the BPF file system.
const DefaultPinDir = "/sys/fs/bpf/urnbd"

const bpfFSRoot = "/sys/fs/bpf"

// Options are the options every loader takes.
type Options struct {
	// PinDir, when set, pins the maps there by name (urnbd_*), so that
	// `bpftool map show` and `bpftool map dump pinned PinDir/NAME` see
	// them. The directory is created; it must be in a BPF file system,
	// and one is mounted on /sys/fs/bpf first if PinDir is below it and
	// none is mounted (as bpftool does). Maps already pinned there are
	// reused, so their counts survive a restart; only one loader of a
	// kind may use a pin directory at a time, or each request is counted
	// by every loader.
	PinDir string
	// KeepPins leaves the pins in place on Close (the maps then live
	// on, without programs feeding them, until the pins are removed).
	KeepPins bool
}

// collectionOptions prepares the pin directory and returns what
// LoadAndAssign needs to pin the maps of spec there.
func (o Options) collectionOptions(spec *ebpf.CollectionSpec) (*ebpf.CollectionOptions, error) {
	opts := &ebpf.CollectionOptions{}
	if o.PinDir == "" {
		return opts, nil
	}
	if err := preparePinDir(o.PinDir); err != nil {
		return nil, err
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinByName
	}
	opts.Maps.PinPath = o.PinDir
	return opts, nil
}

// preparePinDir creates dir in a BPF file system, mounting one on
// /sys/fs/bpf if dir is below it and it is not one yet.
func preparePinDir(dir string) error {
	if under(dir, bpfFSRoot) && !isBPFFS(bpfFSRoot) {
		if err := unix.Mount("bpf", bpfFSRoot, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpf file system on %s: %w", bpfFSRoot, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pin directory: %w", err)
	}
	if !isBPFFS(dir) {
		return fmt.Errorf("pin directory %s is not in a BPF file system (mount -t bpf bpf DIR)", dir)
	}
	return nil
}

func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func isBPFFS(path string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.BPF_FS_MAGIC
}

// unpin removes the pins of maps and, if then empty, the pin directory.
func unpin(dir string, maps ...*ebpf.Map) error {
	var errs []error
	for _, m := range maps {
		if m != nil && m.IsPinned() {
			errs = append(errs, m.Unpin())
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
