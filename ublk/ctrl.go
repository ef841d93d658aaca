package ublk

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/uring"
)

// ControlPath is the ublk control device.
const ControlPath = "/dev/ublk-control"

// ErrNoDriver says that the ublk driver is not loaded (no
// /dev/ublk-control); it wraps ENODEV.
var ErrNoDriver = fmt.Errorf("ublk driver not available: "+ControlPath+
	" is missing; load it with 'modprobe ublk_drv' (kernel 6.1 or newer, CONFIG_BLK_DEV_UBLK): %w", unix.ENODEV)

// Control sends control commands to /dev/ublk-control through its own
// io_uring (128-byte entries, as URING_CMD needs for the 32-byte command).
// Commands are synchronous; a Control may be used from several goroutines,
// one command at a time.
type Control struct {
	mu   sync.Mutex
	f    *os.File
	ring *uring.Ring
	// buf is the command's data buffer: heap memory, which the Go runtime
	// does not move, unlike a goroutine stack that the kernel would be
	// writing to while the stack grows.
	buf []byte
}

// OpenControl opens the control device.
func OpenControl() (*Control, error) {
	f, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNoDriver
		}
		return nil, fmt.Errorf("open %s: %w", ControlPath, err)
	}
	ring, err := uring.New(4, uring.SetupSQE128)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("control ring: %w", err)
	}
	return &Control{f: f, ring: ring, buf: make([]byte, 512)}, nil
}

// Close releases the control device.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ring != nil {
		c.ring.Close()
		c.ring = nil
	}
	if c.f != nil {
		err := c.f.Close()
		c.f = nil
		return err
	}
	return nil
}

// cmdError is the error of a failed control command: the command's name and
// the kernel's errno, so errors.Is(err, unix.EEXIST) works.
type cmdError struct {
	name  string
	devID uint32
	errno unix.Errno
}

func (e *cmdError) Error() string {
	if e.devID == ^uint32(0) {
		return fmt.Sprintf("ublk %s: %v", e.name, e.errno)
	}
	return fmt.Sprintf("ublk %s (device %d): %v", e.name, e.devID, e.errno)
}

func (e *cmdError) Unwrap() error { return e.errno }

// do runs one control command and returns the completion's result. If data
// is not nil, it is the command's buffer: copied in before and back after.
func (c *Control) do(name string, op uint32, cmd *CtrlCmd, data unsafe.Pointer, size uintptr) (int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ring == nil {
		return 0, fmt.Errorf("ublk %s: control device closed", name)
	}
	var buf []byte
	if data != nil {
		buf = c.buf[:size]
		copy(buf, unsafe.Slice((*byte)(data), size))
		cmd.Addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
		cmd.Len = uint16(size)
		defer copy(unsafe.Slice((*byte)(data), size), buf)
	}
	sqe := c.ring.GetSQE128()
	if sqe == nil {
		return 0, fmt.Errorf("ublk %s: control ring full", name)
	}
	sqe.PrepUringCmd(int32(c.f.Fd()), op, 0)
	*(*CtrlCmd)(unsafe.Pointer(sqe.Cmd())) = *cmd
	for {
		if _, err := c.ring.SubmitAndWait(1); err != nil {
			return 0, fmt.Errorf("ublk %s: %w", name, err)
		}
		cqe := c.ring.PeekCQE()
		if cqe == nil {
			continue
		}
		res := cqe.Res
		c.ring.CQESeen()
		if res < 0 {
			return res, &cmdError{name: name, devID: cmd.DevID, errno: unix.Errno(-res)}
		}
		return res, nil
	}
}

// Features returns the feature flags (Flag*) that the driver supports.
func (c *Control) Features() (uint64, error) {
	var features uint64
	cmd := CtrlCmd{DevID: ^uint32(0), QueueID: ^uint16(0)}
	_, err := c.do("GET_FEATURES", opGetFeatures, &cmd, unsafe.Pointer(&features), 8)
	return features, err
}

// AddDev creates a device from info. info.DevID may be ^uint32(0) to let the
// kernel choose. On return info holds what the kernel stored: the device id
// and the negotiated flags.
func (c *Control) AddDev(info *DevInfo) error {
	cmd := CtrlCmd{DevID: info.DevID, QueueID: ^uint16(0)}
	_, err := c.do("ADD_DEV", opAddDev, &cmd, unsafe.Pointer(info), sizeofDevInfo)
	return err
}

// DelDev deletes a stopped device and waits until its number is free, which
// is after its server has closed the char device.
func (c *Control) DelDev(id uint32) error {
	_, err := c.do("DEL_DEV", opDelDev, &CtrlCmd{DevID: id, QueueID: ^uint16(0)}, nil, 0)
	return err
}

// StartDev exposes the block device. Every tag of every queue must have a
// FETCH_REQ queued; the kernel waits for that. pid is the serving process.
func (c *Control) StartDev(id uint32, pid int) error {
	_, err := c.do("START_DEV", opStartDev, &CtrlCmd{DevID: id, QueueID: ^uint16(0), Data: uint64(pid)}, nil, 0)
	return err
}

// StopDev removes the block device; pending fetch commands complete with
// an abort, which ends the queues' loops.
func (c *Control) StopDev(id uint32) error {
	_, err := c.do("STOP_DEV", opStopDev, &CtrlCmd{DevID: id, QueueID: ^uint16(0)}, nil, 0)
	return err
}

// TryStopDev stops the device unless its block device is open, which it
// checks under the lock that opens take: EBUSY if it is open. It needs
// FlagSafeStopDev (7.x); without it the kernel answers EINVAL.
func (c *Control) TryStopDev(id uint32) error {
	_, err := c.do("TRY_STOP_DEV", opTryStopDev, &CtrlCmd{DevID: id, QueueID: ^uint16(0)}, nil, 0)
	return err
}

// UpdateSize sets the size of a started device, in 512-byte sectors, and
// tells the block layer (and so udev and the partition code). It needs
// FlagUpdateSize (7.x).
func (c *Control) UpdateSize(id uint32, sectors uint64) error {
	_, err := c.do("UPDATE_SIZE", opUpdateSize, &CtrlCmd{DevID: id, QueueID: ^uint16(0), Data: sectors}, nil, 0)
	return err
}

// Resize sets the size of started device id to size bytes, a non-zero
// multiple of its logical block size: I/O beyond it fails from then on,
// and the block layer tells udev. Without FlagUpdateSize negotiated (6.12
// has none) it fails with EOPNOTSUPP.
func (c *Control) Resize(id uint32, size uint64) error {
	info, err := c.DevInfo(id)
	if err != nil {
		return err
	}
	if info.Flags&FlagUpdateSize == 0 {
		return fmt.Errorf("ublk device %d: the driver cannot resize a started device (no update_size): %w", id, unix.EOPNOTSUPP)
	}
	p, err := c.Params(id)
	if err != nil {
		return err
	}
	if lbs := uint64(1) << p.Basic.LogicalBSShift; size == 0 || size%lbs != 0 {
		return fmt.Errorf("ublk device %d: size %d: want a non-zero multiple of the logical block size %d: %w", id, size, lbs, unix.EINVAL)
	}
	return c.UpdateSize(id, size>>9)
}

// SetParams sets the device's parameters; only before START_DEV.
func (c *Control) SetParams(id uint32, p *Params) error {
	p.Len = sizeofParams
	cmd := CtrlCmd{DevID: id, QueueID: ^uint16(0)}
	_, err := c.do("SET_PARAMS", opSetParams, &cmd, unsafe.Pointer(p), sizeofParams)
	return err
}

// Params returns the device's parameters, the read-only devt included.
func (c *Control) Params(id uint32) (Params, error) {
	p := Params{Len: sizeofParams, Types: ParamTypeBasic | ParamTypeDiscard | ParamTypeDevt}
	cmd := CtrlCmd{DevID: id, QueueID: ^uint16(0)}
	_, err := c.do("GET_PARAMS", opGetParams, &cmd, unsafe.Pointer(&p), sizeofParams)
	return p, err
}

// DevInfo returns the device's information and state.
func (c *Control) DevInfo(id uint32) (DevInfo, error) {
	var info DevInfo
	cmd := CtrlCmd{DevID: id, QueueID: ^uint16(0)}
	_, err := c.do("GET_DEV_INFO", opGetDevInfo, &cmd, unsafe.Pointer(&info), sizeofDevInfo)
	return info, err
}

// QueueAffinity returns the CPUs that the block layer maps to queue q.
func (c *Control) QueueAffinity(id uint32, q uint16) (unix.CPUSet, error) {
	var set unix.CPUSet
	// The kernel reads the queue from data[0], not queue_id
	// (ublk_ctrl_get_queue_affinity).
	cmd := CtrlCmd{DevID: id, QueueID: ^uint16(0), Data: uint64(q)}
	_, err := c.do("GET_QUEUE_AFFINITY", opGetQueueAffinity, &cmd, unsafe.Pointer(&set), unsafe.Sizeof(set))
	return set, err
}

// StartUserRecovery prepares a quiesced device (its server died) for a new
// server; the old server's char device must be closed.
func (c *Control) StartUserRecovery(id uint32) error {
	_, err := c.do("START_USER_RECOVERY", opStartUserRecovery, &CtrlCmd{DevID: id, QueueID: ^uint16(0)}, nil, 0)
	return err
}

// EndUserRecovery hands the device to the new server pid once every tag has
// been fetched again, and resumes I/O.
func (c *Control) EndUserRecovery(id uint32, pid int) error {
	_, err := c.do("END_USER_RECOVERY", opEndUserRecovery, &CtrlCmd{DevID: id, QueueID: ^uint16(0), Data: uint64(pid)}, nil, 0)
	return err
}
