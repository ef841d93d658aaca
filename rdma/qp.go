package rdma

/*
#include "crdma.h"
*/
import "C"

import "fmt"

// QPCap are the capacities of a queue pair (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR     uint32 // outstanding send work requests
	MaxRecvWR     uint32 // outstanding receive work requests
	MaxSendSGE    uint32 // SGEs per send work request
	MaxRecvSGE    uint32 // SGEs per receive work request
	MaxInlineData uint32 // bytes of inline data per send work request
}

// QPAttr describe a queue pair for CreateQP.
type QPAttr struct {
	SendCQ, RecvCQ *CQ // may be the same CQ
	Cap            QPCap
	// SignalAll makes every send work request generate a completion;
	// otherwise only those with SendSignaled do.
	SignalAll bool
}

// QP is a reliable connected queue pair (struct ibv_qp) owned by a CM id.
type QP struct {
	id  *CMID
	qp  *C.struct_ibv_qp
	cap QPCap
}

// CreateQP creates an RC queue pair on the id's device (rdma_create_qp)
// in pd; the CM moves it through its states as the connection is made.
// Call it after EventRouteResolved (active side) or on the id of an
// EventConnectRequest (passive side), before Connect or Accept.
func (id *CMID) CreateQP(pd *PD, attr QPAttr) (*QP, error) {
	if id.id == nil || pd.pd == nil {
		return nil, ErrClosed
	}
	if attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, fmt.Errorf("rdma_create_qp: need a send and a receive CQ")
	}
	sig := C.int(0)
	if attr.SignalAll {
		sig = 1
	}
	var capOut C.struct_ibv_qp_cap
	c := attr.Cap
	ret, err := C.urnbd_create_qp(id.id, pd.pd, attr.SendCQ.cq, attr.RecvCQ.cq,
		C.uint32_t(c.MaxSendWR), C.uint32_t(c.MaxRecvWR), C.uint32_t(c.MaxSendSGE),
		C.uint32_t(c.MaxRecvSGE), C.uint32_t(c.MaxInlineData), sig, &capOut)
	if ret != 0 {
		return nil, fmt.Errorf("rdma_create_qp %s %+v: %w", id.DeviceName(), c, errnoOf(err))
	}
	qp := &QP{id: id, qp: C.urnbd_id_qp(id.id), cap: QPCap{
		MaxSendWR:     uint32(capOut.max_send_wr),
		MaxRecvWR:     uint32(capOut.max_recv_wr),
		MaxSendSGE:    uint32(capOut.max_send_sge),
		MaxRecvSGE:    uint32(capOut.max_recv_sge),
		MaxInlineData: uint32(capOut.max_inline_data),
	}}
	id.qp = qp
	return qp, nil
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return uint32(qp.qp.qp_num) }

// Cap returns the capacities the provider granted (at least those asked
// for).
func (qp *QP) Cap() QPCap { return qp.cap }

// ID returns the CM id that owns the QP.
func (qp *QP) ID() *CMID { return qp.id }

// Destroy destroys the QP (rdma_destroy_qp). CMID.Destroy does it too.
func (qp *QP) Destroy() {
	if qp.qp == nil {
		return
	}
	C.rdma_destroy_qp(qp.id.id)
	qp.qp = nil
	qp.id.qp = nil
}
