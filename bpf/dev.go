//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Devices are named by their user-space dev_t, as in unix.Stat_t's Dev and
// Rdev and unix.Mkdev. The programs key their maps by the kernel's own
// encoding (major << 20 | minor), which these functions convert to and
// from.

// ErrNotBlockDevice means a path is not on, or is not, a block device
// (tmpfs, overlayfs and other file systems without a disk).
var ErrNotBlockDevice = errors.New("not a block device")

const minorBits = 20

// kernelDev converts a user-space dev_t to the kernel's.
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<minorBits | unix.Minor(dev)&(1<<minorBits-1)
}

// userDev converts a kernel dev_t to a user-space one.
func userDev(kdev uint32) uint64 {
	return unix.Mkdev(kdev>>minorBits, kdev&(1<<minorBits-1))
}

// DiskOf returns the whole-disk device that block requests for path are
// issued to, the device the programs see: for a block device node
// (/dev/ublkb0, /dev/vda1), that device; for another file, the device of
// its file system. A partition is replaced by its disk, since the block
// tracepoints report the disk. It fails with ErrNotBlockDevice when the
// device has no entry under /sys/dev/block.
func DiskOf(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	dev := st.Dev
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		dev = st.Rdev
	}
	return WholeDisk(dev)
}

// WholeDisk returns the disk of dev if dev is a partition, else dev. It
// fails with ErrNotBlockDevice when dev is not a block device.
func WholeDisk(dev uint64) (uint64, error) {
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev))
	if _, err := os.Stat(sys); err != nil {
		return 0, fmt.Errorf("device %d:%d: %w", unix.Major(dev), unix.Minor(dev), ErrNotBlockDevice)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err != nil {
		return dev, nil
	}
	b, err := os.ReadFile(filepath.Join(sys, "..", "dev"))
	if err != nil {
		return 0, fmt.Errorf("disk of partition %d:%d: %w", unix.Major(dev), unix.Minor(dev), err)
	}
	return parseDev(strings.TrimSpace(string(b)))
}

// parseDev parses "MAJOR:MINOR".
func parseDev(s string) (uint64, error) {
	var major, minor uint32
	if _, err := fmt.Sscanf(s, "%d:%d", &major, &minor); err != nil {
		return 0, fmt.Errorf("device number %q: %w", s, err)
	}
	return unix.Mkdev(major, minor), nil
}

// DevName returns "MAJOR:MINOR" of dev.
func DevName(dev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
}
