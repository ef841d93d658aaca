package rdma

/*
#include "crdma.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Access are memory region access flags (enum ibv_access_flags).
type Access int

// Access flags. Remote write and atomic access need AccessLocalWrite too.
const (
	AccessLocalWrite   Access = C.IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite  Access = C.IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead   Access = C.IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic Access = C.IBV_ACCESS_REMOTE_ATOMIC
	AccessRelaxedOrder Access = C.IBV_ACCESS_RELAXED_ORDERING
)

// MR is a registered memory region (struct ibv_mr).
type MR struct {
	mr  *C.struct_ibv_mr
	buf []byte
}

// RegMR registers buf with the device for the given access
// (ibv_reg_mr).
//
// The device reads and writes buf behind Go's back for as long as it is
// registered, so buf must stay where it is and stay alive until Dereg: use
// memory from mmap(2) (unix.Mmap, MAP_ANONYMOUS|MAP_PRIVATE, or a shared
// mapping), never the Go heap, which the garbage collector may free and
// whose pointers cgo forbids C to keep.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if pd.pd == nil {
		return nil, ErrClosed
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("ibv_reg_mr: empty buffer: %w", unix.EINVAL)
	}
	p := unsafe.Pointer(unsafe.SliceData(buf))
	mr, err := C.ibv_reg_mr(pd.pd, p, C.size_t(len(buf)), C.int(access))
	if mr == nil {
		return nil, fmt.Errorf("ibv_reg_mr %s %#x+%d: %w", pd.ctx.DeviceName(), uintptr(p), len(buf), errnoOf(err))
	}
	return &MR{mr: mr, buf: buf}, nil
}

// LKey is the key that local work requests (SGE.LKey) use.
func (m *MR) LKey() uint32 { return uint32(m.mr.lkey) }

// RKey is the key the peer uses for RDMA to this region.
func (m *MR) RKey() uint32 { return uint32(m.mr.rkey) }

// Addr is the region's start address, as SGEs and the peer use it.
func (m *MR) Addr() uint64 { return uint64(uintptr(m.mr.addr)) }

// Len is the region's length in bytes.
func (m *MR) Len() int { return int(m.mr.length) }

// Bytes returns the registered buffer.
func (m *MR) Bytes() []byte { return m.buf }

// SGE returns a scatter/gather element for buf[off:off+n] of the region.
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey()}
}

// Dereg deregisters the region (ibv_dereg_mr); the caller may then unmap
// the memory.
func (m *MR) Dereg() error {
	if m.mr == nil {
		return ErrClosed
	}
	if ret, err := C.ibv_dereg_mr(m.mr); ret != 0 {
		return fmt.Errorf("ibv_dereg_mr: %w", retErrno(int(ret), err))
	}
	m.mr = nil
	return nil
}
