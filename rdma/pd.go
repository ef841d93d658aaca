package rdma

/*
#include "crdma.h"
*/
import "C"

import "fmt"

// PD is a protection domain (struct ibv_pd): QPs and memory regions that
// work together must belong to the same one.
type PD struct {
	pd  *C.struct_ibv_pd
	ctx Context
}

// AllocPD allocates a protection domain on the device (ibv_alloc_pd).
func (c Context) AllocPD() (*PD, error) {
	if c.ctx == nil {
		return nil, ErrClosed
	}
	pd, err := C.ibv_alloc_pd(c.ctx)
	if pd == nil {
		return nil, fmt.Errorf("ibv_alloc_pd %s: %w", c.DeviceName(), errnoOf(err))
	}
	return &PD{pd: pd, ctx: c}, nil
}

// Context returns the device the PD belongs to.
func (pd *PD) Context() Context { return pd.ctx }

// Dealloc frees the protection domain (ibv_dealloc_pd); its QPs and memory
// regions must be gone.
func (pd *PD) Dealloc() error {
	if pd.pd == nil {
		return ErrClosed
	}
	if ret, err := C.ibv_dealloc_pd(pd.pd); ret != 0 {
		return fmt.Errorf("ibv_dealloc_pd %s: %w", pd.ctx.DeviceName(), retErrno(int(ret), err))
	}
	pd.pd = nil
	return nil
}
