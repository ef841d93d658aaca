package ublk

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of Options.
const (
	DefaultQueueDepth = 128
	DefaultMaxIOBytes = 512 << 10
)

// Options describe a device to create.
type Options struct {
	// ID is the device number wanted, or -1 to let the kernel choose.
	ID int
	// Queues is the number of hardware queues; 0 means one per CPU.
	Queues int
	// Depth is the number of tags per queue; 0 means DefaultQueueDepth.
	Depth int
	// MaxIOBytes is the largest request and the size of each tag's buffer;
	// 0 means DefaultMaxIOBytes. A multiple of the page size.
	MaxIOBytes int
	// Size is the device's size in bytes, a multiple of LogicalBlockSize.
	Size uint64
	// LogicalBlockSize and PhysicalBlockSize: powers of two from 512 to
	// the page size; 0 means 512 and LogicalBlockSize.
	LogicalBlockSize  uint32
	PhysicalBlockSize uint32
	ReadOnly          bool
	Rotational        bool
	// VolatileCache says that completed writes may sit in a cache until a
	// flush; FUA that the target honours IOFlagFUA.
	VolatileCache bool
	FUA           bool
	// Discard and write-zeroes limits in sectors; zero disables them.
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	DiscardGranularity    uint32
	// NoRecovery disables user recovery. By default a device survives the
	// death of its server: it is quiesced until Recover takes it over, and
	// the requests in flight are issued again.
	NoRecovery bool
	// NoBatchIO makes the queues use the per-tag protocol (one command
	// per request) even where the driver offers FlagBatchIO; for
	// comparisons.
	NoBatchIO bool
	// NoZeroCopy keeps the tags' buffers and the copy through them for a
	// ZeroCopier target too; for comparisons.
	NoZeroCopy bool
	// Buffers, if not nil, is the memory from which the tags' buffers are
	// carved: Queues × Depth × MaxIOBytes bytes, page aligned. A transport
	// registers it for RDMA so that data moves without a copy.
	Buffers []byte
}

func (o *Options) setDefaults() error {
	if o.Queues == 0 {
		o.Queues = runtime.NumCPU()
	}
	if o.Depth == 0 {
		o.Depth = DefaultQueueDepth
	}
	if o.MaxIOBytes == 0 {
		o.MaxIOBytes = DefaultMaxIOBytes
	}
	if o.LogicalBlockSize == 0 {
		o.LogicalBlockSize = 512
	}
	if o.PhysicalBlockSize == 0 {
		o.PhysicalBlockSize = o.LogicalBlockSize
	}
	page := unix.Getpagesize()
	switch {
	case o.Queues < 1 || o.Queues > MaxQueues:
		return fmt.Errorf("queues %d: want 1..%d: %w", o.Queues, MaxQueues, unix.EINVAL)
	case o.Depth < 1 || o.Depth > MaxQueueDepth:
		return fmt.Errorf("queue depth %d: want 1..%d: %w", o.Depth, MaxQueueDepth, unix.EINVAL)
	case o.MaxIOBytes < page || o.MaxIOBytes%page != 0:
		return fmt.Errorf("max I/O size %d: want a multiple of the page size %d: %w", o.MaxIOBytes, page, unix.EINVAL)
	case !validBlockSize(o.LogicalBlockSize, page) || !validBlockSize(o.PhysicalBlockSize, page) ||
		o.PhysicalBlockSize < o.LogicalBlockSize:
		return fmt.Errorf("block sizes %d/%d: want powers of two from 512 to %d, physical ≥ logical: %w",
			o.LogicalBlockSize, o.PhysicalBlockSize, page, unix.EINVAL)
	case o.Size == 0 || o.Size%uint64(o.LogicalBlockSize) != 0:
		return fmt.Errorf("size %d: want a non-zero multiple of the logical block size %d: %w", o.Size, o.LogicalBlockSize, unix.EINVAL)
	}
	if o.Buffers != nil && len(o.Buffers) < o.Queues*o.Depth*o.MaxIOBytes {
		return fmt.Errorf("buffer region of %d bytes: need %d: %w", len(o.Buffers), o.Queues*o.Depth*o.MaxIOBytes, unix.EINVAL)
	}
	return nil
}

func validBlockSize(bs uint32, page int) bool {
	return bs >= 512 && int(bs) <= page && bs&(bs-1) == 0
}

func log2(v uint32) uint8 {
	n := uint8(0)
	for v > 1 {
		v >>= 1
		n++
	}
	return n
}

func (o *Options) params() Params {
	p := Params{Types: ParamTypeBasic}
	p.Basic = ParamBasic{
		LogicalBSShift:  log2(o.LogicalBlockSize),
		PhysicalBSShift: log2(o.PhysicalBlockSize),
		IOMinShift:      log2(o.PhysicalBlockSize),
		IOOptShift:      log2(o.PhysicalBlockSize),
		MaxSectors:      uint32(o.MaxIOBytes >> 9),
		DevSectors:      o.Size >> 9,
	}
	if o.ReadOnly {
		p.Basic.Attrs |= AttrReadOnly
	}
	if o.Rotational {
		p.Basic.Attrs |= AttrRotational
	}
	if o.VolatileCache {
		p.Basic.Attrs |= AttrVolatileCache
		if o.FUA {
			p.Basic.Attrs |= AttrFUA
		}
	}
	if o.MaxDiscardSectors != 0 || o.MaxWriteZeroesSectors != 0 {
		p.Types |= ParamTypeDiscard
		g := o.DiscardGranularity
		if g == 0 {
			g = o.PhysicalBlockSize
		}
		p.Discard = ParamDiscard{
			DiscardGranularity:    g,
			MaxDiscardSectors:     o.MaxDiscardSectors,
			MaxWriteZeroesSectors: o.MaxWriteZeroesSectors,
			MaxDiscardSegments:    1,
		}
	}
	return p
}

// Device is a ublk device served by this process.
type Device struct {
	ctrl    *Control
	info    DevInfo
	char    *os.File
	bufs    []byte
	ownBufs bool
	queues  []*Queue
	done    chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex // orders Handover's wake-ups before release
	released bool       // the queues' eventfds are closed
}

// BlockPath returns the path of device id's block device.
func BlockPath(id uint32) string { return fmt.Sprintf("/dev/ublkb%d", id) }

// CharPath returns the path of device id's char device.
func CharPath(id uint32) string { return fmt.Sprintf("/dev/ublkc%d", id) }

// UsedFeatures are the driver features Create needs (the recovery ones
// unless Options.NoRecovery).
const UsedFeatures = FlagCmdIoctlEncode | FlagUserRecovery | FlagUserRecoveryReissue

// OptionalFeatures are the driver features Create asks for where the
// driver offers them, and what each gives: FlagSafeStopDev makes TryStop
// atomic against opens, FlagUpdateSize lets Resize change a started
// device's size (without them TryStop and Resize fail with EOPNOTSUPP),
// FlagBatchIO lets each queue fetch and commit many requests per command
// (Options.NoBatchIO turns it down), and FlagQuiesce lets Handover have
// the driver stop handing out requests (only with user recovery).
const OptionalFeatures = FlagSafeStopDev | FlagUpdateSize | FlagBatchIO | FlagQuiesce

// Wanted returns the features Create asks for of a driver that offers
// offered: UsedFeatures, and those of OptionalFeatures it offers.
func Wanted(offered uint64) uint64 { return UsedFeatures | offered&OptionalFeatures }

// Create adds a device, starts its queues with target and exposes the block
// device. On error nothing is left behind.
func Create(ctrl *Control, opts Options, target Target) (*Device, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	want := UsedFeatures
	if opts.NoRecovery {
		want &^= FlagUserRecovery | FlagUserRecoveryReissue
	}
	if features, err := ctrl.Features(); err == nil {
		if want&features != want {
			return nil, fmt.Errorf("ublk driver lacks features %#x (has %#x): %w", want&^features, features, unix.EOPNOTSUPP)
		}
		want |= features & OptionalFeatures
		if opts.NoRecovery {
			want &^= FlagQuiesce // the driver refuses it without recovery
		}
		if opts.NoBatchIO {
			want &^= FlagBatchIO
		}
		if zc, ok := target.(ZeroCopier); ok && zc.ZeroCopy() && opts.Buffers == nil && !opts.NoZeroCopy {
			want |= features & FlagAutoBufReg
		}
	}
	id := ^uint32(0)
	if opts.ID >= 0 {
		id = uint32(opts.ID)
	}
	info := DevInfo{
		NrHWQueues:    uint16(opts.Queues),
		QueueDepth:    uint16(opts.Depth),
		MaxIOBufBytes: uint32(opts.MaxIOBytes),
		DevID:         id,
		ServerPID:     int32(os.Getpid()),
		Flags:         want,
	}
	if err := ctrl.AddDev(&info); err != nil {
		return nil, err
	}
	if int(info.MaxIOBufBytes) < opts.MaxIOBytes {
		opts.MaxIOBytes = int(info.MaxIOBufBytes)
	}
	p := opts.params()
	if err := ctrl.SetParams(info.DevID, &p); err != nil {
		ctrl.DelDev(info.DevID)
		return nil, err
	}
	d := &Device{ctrl: ctrl, info: info}
	if err := d.startQueues(target, opts.Buffers, opts.MaxIOBytes); err != nil {
		d.abandon()
		return nil, err
	}
	if err := ctrl.StartDev(info.DevID, os.Getpid()); err != nil {
		d.abandon()
		return nil, err
	}
	d.info.State = StateLive
	return d, nil
}

// Recover takes over device id, whose server died, with a new target: it
// must serve the same data. The device must have been created with
// recovery enabled; the I/O that was in flight is issued again. buffers is
// as Options.Buffers, or nil.
func Recover(ctrl *Control, id uint32, target Target, buffers []byte) (*Device, error) {
	info, err := waitQuiesced(ctrl, id)
	if err != nil {
		return nil, err
	}
	// START_USER_RECOVERY fails with EBUSY until the dead server's char
	// device is released, which may trail its exit a little.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = ctrl.StartUserRecovery(id)
		if err == nil || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	d := &Device{ctrl: ctrl, info: info}
	if err := d.startQueues(target, buffers, int(info.MaxIOBufBytes)); err != nil {
		d.abandon()
		return nil, err
	}
	if err := ctrl.EndUserRecovery(id, os.Getpid()); err != nil {
		d.abandon()
		return nil, err
	}
	d.info.State = StateLive
	d.info.ServerPID = int32(os.Getpid())
	return d, nil
}

// waitQuiesced waits for the kernel to notice that the server died.
func waitQuiesced(ctrl *Control, id uint32) (DevInfo, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := ctrl.DevInfo(id)
		if err != nil {
			return info, err
		}
		if info.Flags&FlagUserRecovery == 0 {
			return info, fmt.Errorf("device %d was created without user recovery: %w", id, unix.EOPNOTSUPP)
		}
		switch info.State {
		case StateQuiesced:
			return info, nil
		case StateDead:
			return info, fmt.Errorf("device %d is stopped, nothing to recover: %w", id, unix.ENODEV)
		}
		if info.ServerPID > 0 && unix.Kill(int(info.ServerPID), 0) == nil && time.Now().After(deadline) {
			return info, fmt.Errorf("device %d is live, served by pid %d: %w", id, info.ServerPID, unix.EBUSY)
		}
		if time.Now().After(deadline) {
			return info, fmt.Errorf("device %d: still live 10s after its server died: %w", id, unix.EBUSY)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *Device) startQueues(target Target, buffers []byte, maxIO int) error {
	id := d.info.DevID
	var err error
	if d.info.Flags&FlagAutoBufReg != 0 {
		if zc, ok := target.(ZeroCopier); !ok || !zc.ZeroCopy() {
			return fmt.Errorf("ublk device %d serves requests from their own pages (auto_buf_reg), which this target cannot: %w", id, unix.EINVAL)
		}
	}
	// The char device appears through devtmpfs (or udev) just after
	// ADD_DEV; give it a moment.
	for i := 0; i < 100; i++ {
		d.char, err = os.OpenFile(CharPath(id), os.O_RDWR, 0)
		if !errors.Is(err, os.ErrNotExist) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", CharPath(id), err)
	}
	nq, depth := int(d.info.NrHWQueues), int(d.info.QueueDepth)
	size := nq * depth * maxIO
	if buffers == nil {
		buffers, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("allocate %d bytes of I/O buffers: %w", size, err)
		}
		d.ownBufs = true
	} else if len(buffers) < size {
		return fmt.Errorf("buffer region of %d bytes: need %d: %w", len(buffers), size, unix.EINVAL)
	}
	d.bufs = buffers
	d.done = make(chan struct{})
	ready := make(chan error, nq)
	for i := 0; i < nq; i++ {
		cpus, err := d.ctrl.QueueAffinity(id, uint16(i))
		if err != nil {
			cpus = unix.CPUSet{}
		}
		wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			d.release()
			close(d.done) // no queue ran
			return fmt.Errorf("queue %d: eventfd: %w", i, err)
		}
		q := &Queue{
			wakeFd: wake,
			id:     uint16(i),
			depth:  depth,
			maxIO:  maxIO,
			charFd: int32(d.char.Fd()),
			cpus:   cpus,
			bufs:   buffers[i*depth*maxIO : (i+1)*depth*maxIO],

			batchIO:    d.info.Flags&FlagBatchIO != 0,
			autoBufReg: d.info.Flags&FlagAutoBufReg != 0,
		}
		d.queues = append(d.queues, q)
	}
	return d.launch(target, ready)
}

// launch starts the queues' threads and waits until each has queued its
// fetches (or failed). When the last queue ends, the char device is closed,
// which is what lets a pending DEL_DEV complete.
func (d *Device) launch(target Target, ready chan error) error {
	for _, q := range d.queues {
		d.wg.Add(1)
		go func(q *Queue) {
			defer d.wg.Done()
			q.run(target, ready)
		}(q)
	}
	go func() {
		d.wg.Wait()
		for _, q := range d.queues {
			if q.orphan != nil {
				waitThreadGone(q.tid)
				q.orphan.Close()
			}
		}
		d.release()
		close(d.done)
	}()
	var first error
	for range d.queues {
		if err := <-ready; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitThreadGone waits, up to 5 s, until thread tid of this process has
// exited.
func waitThreadGone(tid int) {
	path := fmt.Sprintf("/proc/self/task/%d", tid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
}

func (d *Device) release() {
	d.mu.Lock()
	for _, q := range d.queues {
		unix.Close(q.wakeFd)
	}
	d.released = true
	d.mu.Unlock()
	if d.char != nil {
		d.char.Close()
	}
	if d.ownBufs {
		unix.Munmap(d.bufs)
	}
}

// abandon undoes a failed Create or Recover. A new device is deleted. A
// device being recovered is left to the kernel: it returns to the quiesced
// state when this process exits.
func (d *Device) abandon() {
	if d.info.State == StateQuiesced {
		return
	}
	d.ctrl.DelDev(d.info.DevID)
	if d.done != nil {
		<-d.done
	} else if d.char != nil {
		d.char.Close()
	}
}

// ID returns the device number.
func (d *Device) ID() uint32 { return d.info.DevID }

// Info returns the device's information as of its start.
func (d *Device) Info() DevInfo { return d.info }

// Done is closed when every queue has ended.
func (d *Device) Done() <-chan struct{} { return d.done }

// Wait waits until every queue has ended, which happens when the device is
// stopped or deleted (by this process or another), and returns the first
// queue error.
func (d *Device) Wait() error {
	<-d.done
	for _, q := range d.queues {
		if q.err != nil {
			return q.err
		}
	}
	return nil
}

// Stop removes the block device and waits for the queues to end. Requests
// still queued fail with an I/O error; the device can then only be deleted.
func (d *Device) Stop() error {
	if err := d.ctrl.StopDev(d.info.DevID); err != nil {
		return err
	}
	return d.Wait()
}

// TryStop stops the device unless its block device is open or mounted:
// then it fails with EBUSY and nothing changes. The driver checks under the
// lock that opens take, so no open slips in between; without
// FlagSafeStopDev (Linux 6.12) it fails with EOPNOTSUPP, and the caller
// has only racy checks from user space.
func (d *Device) TryStop() error {
	if d.info.Flags&FlagSafeStopDev == 0 {
		return fmt.Errorf("ublk device %d: the driver cannot stop a device only when unused (no safe_stop_dev): %w", d.info.DevID, unix.EOPNOTSUPP)
	}
	if err := d.ctrl.TryStopDev(d.info.DevID); err != nil {
		return err
	}
	return d.Wait()
}

// Resize sets the size of the started device to size bytes, as
// Control.Resize.
func (d *Device) Resize(size uint64) error { return d.ctrl.Resize(d.info.DevID, size) }

// Delete stops the device and deletes it.
func (d *Device) Delete() error {
	err := d.Stop()
	if derr := d.ctrl.DelDev(d.info.DevID); derr != nil && !errors.Is(derr, unix.ENODEV) {
		return derr
	}
	return err
}
