package uring

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Register calls io_uring_register(2) with one of the Reg* opcodes; arg and
// nrArgs are as the kernel documents for that opcode. arg must point to
// memory that stays valid for the duration of the call. A signal
// interrupting the call restarts it.
func (r *Ring) Register(opcode uint32, arg unsafe.Pointer, nrArgs uint32) error {
	_, err := r.register(opcode, arg, nrArgs)
	return err
}

func (r *Ring) register(opcode uint32, arg unsafe.Pointer, nrArgs uint32) (int, error) {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd),
			uintptr(opcode), uintptr(arg), uintptr(nrArgs), 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, fmt.Errorf("io_uring_register opcode %d: %w", opcode, errno)
		}
		return int(n), nil
	}
}

// RegisterBuffers registers iovs as fixed buffers 0..len(iovs)-1 for
// PrepReadFixed, PrepWriteFixed and UringCmdFixed. The kernel pins the pages
// until UnregisterBuffers or Close; if they are Go memory, the caller must
// keep it reachable that long, or the Go runtime may reuse it while the
// kernel still reads and writes it. Memory from mmap is the safe choice.
func (r *Ring) RegisterBuffers(iovs []unix.Iovec) error {
	if len(iovs) == 0 {
		return fmt.Errorf("io_uring_register buffers: no buffers: %w", unix.EINVAL)
	}
	for i := range iovs {
		addr(unsafe.Pointer(iovs[i].Base)) // keep the buffers off the stack
	}
	err := r.Register(RegBuffers, unsafe.Pointer(&iovs[0]), uint32(len(iovs)))
	runtime.KeepAlive(iovs)
	return err
}

// rsrcRegister mirrors struct io_uring_rsrc_register.
type rsrcRegister struct {
	nr    uint32
	flags uint32
	_     uint64
	data  uint64
	tags  uint64
}

// rsrcRegisterSparse is IORING_RSRC_REGISTER_SPARSE.
const rsrcRegisterSparse = 1 << 0

// RegisterBuffersSparse registers a fixed-buffer table of n empty slots
// (IORING_REGISTER_BUFFERS2, sparse; Linux 5.19), for buffers that a driver
// installs, such as the request buffers of ublk's automatic buffer
// registration. A buffer a driver installs starts at address 0: the address
// of a fixed read or write from it is the offset into it.
func (r *Ring) RegisterBuffersSparse(n uint32) error {
	rr := rsrcRegister{nr: n, flags: rsrcRegisterSparse}
	err := r.Register(RegBuffers2, unsafe.Pointer(&rr), uint32(unsafe.Sizeof(rr)))
	runtime.KeepAlive(&rr)
	if err != nil {
		return fmt.Errorf("register %d sparse buffers: %w", n, err)
	}
	return nil
}

// UnregisterBuffers drops all registered buffers.
func (r *Ring) UnregisterBuffers() error {
	return r.Register(UnregBuffers, nil, 0)
}

// RegisterFiles registers fds as the fixed file table: SQEs with SQEFixedFile
// set name files by their index in fds. An entry of -1 leaves the slot empty
// (to be filled by UpdateFiles).
func (r *Ring) RegisterFiles(fds []int32) error {
	if len(fds) == 0 {
		return fmt.Errorf("io_uring_register files: no files: %w", unix.EINVAL)
	}
	err := r.Register(RegFiles, unsafe.Pointer(&fds[0]), uint32(len(fds)))
	runtime.KeepAlive(fds)
	return err
}

// UpdateFiles replaces the registered files from slot off on with fds
// (RegisterFilesSkip leaves a slot unchanged, -1 empties it) and returns the
// number of slots updated.
func (r *Ring) UpdateFiles(off uint32, fds []int32) (int, error) {
	if len(fds) == 0 {
		return 0, nil
	}
	// struct io_uring_files_update
	up := struct {
		offset uint32
		resv   uint32
		fds    uint64
	}{offset: off, fds: addr(unsafe.Pointer(&fds[0]))}
	n, err := r.register(RegFilesUpdate, unsafe.Pointer(&up), uint32(len(fds)))
	runtime.KeepAlive(fds)
	return n, err
}

// UnregisterFiles drops the registered file table.
func (r *Ring) UnregisterFiles() error {
	return r.Register(UnregFiles, nil, 0)
}

// RegisterEventfd makes the kernel signal the eventfd fd whenever it posts a
// completion.
func (r *Ring) RegisterEventfd(fd int) error {
	fd32 := int32(fd)
	return r.Register(RegEventfd, unsafe.Pointer(&fd32), 1)
}

// UnregisterEventfd undoes RegisterEventfd.
func (r *Ring) UnregisterEventfd() error {
	return r.Register(UnregEventfd, nil, 0)
}

// EnableRings enables a ring created with SetupRDisabled.
func (r *Ring) EnableRings() error {
	return r.Register(RegEnableRings, nil, 0)
}

// Probe mirrors struct io_uring_probe with room for every possible opcode.
type Probe struct {
	LastOp uint8 // last opcode the kernel knows
	OpsLen uint8 // number of valid entries in Ops
	_      uint16
	_      [3]uint32
	Ops    [256]ProbeOp
}

// ProbeOp mirrors struct io_uring_probe_op.
type ProbeOp struct {
	Op    uint8
	_     uint8
	Flags uint16 // ProbeOpSupported
	_     uint32
}

// Supported reports whether the kernel implements opcode op.
func (p *Probe) Supported(op uint8) bool {
	return op <= p.LastOp && int(op) < int(p.OpsLen) && p.Ops[op].Flags&ProbeOpSupported != 0
}

// Probe asks the kernel which opcodes it supports (IORING_REGISTER_PROBE).
func (r *Ring) Probe() (*Probe, error) {
	p := new(Probe)
	if err := r.Register(RegProbe, unsafe.Pointer(p), uint32(len(p.Ops))); err != nil {
		return nil, err
	}
	return p, nil
}
