package rdma

/*
#include "crdma.h"
*/
import "C"

import "fmt"

// Context is an open RDMA device (struct ibv_context), as an RDMA CM id
// is bound to it. rdma-core opens one context per device for all ids, so
// two ids on the same device have equal Contexts: a Context can key a
// per-device cache of protection domains and memory registrations.
type Context struct {
	ctx *C.struct_ibv_context
}

// IsZero reports whether c is the zero Context (no device).
func (c Context) IsZero() bool { return c.ctx == nil }

// DeviceName returns the device's name (ibv_get_device_name), e.g.
// "rxe0", or "" for the zero Context.
func (c Context) DeviceName() string {
	if c.ctx == nil {
		return ""
	}
	return C.GoString(C.ibv_get_device_name(c.ctx.device))
}

// NumCompVectors returns the number of completion vectors (interrupt
// vectors) of the device, for CreateCQ.
func (c Context) NumCompVectors() int {
	if c.ctx == nil {
		return 0
	}
	return int(c.ctx.num_comp_vectors)
}

// DeviceAttr are the device limits (a part of struct ibv_device_attr).
type DeviceAttr struct {
	MaxQP           int
	MaxQPWR         int // work requests per queue
	MaxSGE          int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxMRSize       uint64
	MaxQPRdAtom     int // outstanding RDMA READs as responder
	MaxQPInitRdAtom int // outstanding RDMA READs as initiator
	FirmwareVersion string
	VendorID        uint32
	VendorPartID    uint32
	PhysPortCnt     int
}

// QueryDevice returns the device's limits (ibv_query_device).
func (c Context) QueryDevice() (DeviceAttr, error) {
	if c.ctx == nil {
		return DeviceAttr{}, ErrClosed
	}
	var a C.struct_ibv_device_attr
	if ret, err := C.ibv_query_device(c.ctx, &a); ret != 0 {
		return DeviceAttr{}, fmt.Errorf("ibv_query_device %s: %w", c.DeviceName(), retErrno(int(ret), err))
	}
	return DeviceAttr{
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		FirmwareVersion: C.GoString(&a.fw_ver[0]),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		PhysPortCnt:     int(a.phys_port_cnt),
	}, nil
}

// ForgetRemovedDevices has librdmacm rescan the RDMA devices, so that it
// closes its contexts of devices that went away (rdma link delete, a hot
// unplugged adapter) once no CM id uses them any more. librdmacm notices a
// removed device only when it rescans, which it does only when asked for
// the device list or when it meets an unknown device; and the kernel
// finishes removing a device (of a driver that cannot disassociate user
// contexts, such as rxe) only when every process closed it. So a process
// that frees its resources on a removed device must call this, or the
// removal hangs for as long as the process lives. It opens the devices
// that are present, as librdmacm does for its device list.
func ForgetRemovedDevices() error {
	var n C.int
	list, err := C.rdma_get_devices(&n)
	if list == nil {
		return fmt.Errorf("rdma_get_devices: %w", retErrno(-1, err))
	}
	C.rdma_free_devices(list)
	return nil
}
