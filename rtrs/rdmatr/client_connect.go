package rdmatr

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/session"
)

// Connect implements session.Transport: it establishes the path as the
// kernel client does, cids 0..CIDNum-1 one after another, then
// INFO_REQ/INFO_RSP on cid 0. Each step is bounded by what is left of
// ctx's deadline.
func (t *transport) Connect(ctx context.Context, p *session.Path) (_ session.Conn, err error) {
	c := (*Client)(t)
	cfg := c.s.Config()
	// CheckPath made sure the addresses parse.
	dst, _ := parseAddr(p.Addr().Dst, rtrs.DefaultPort)
	var src netip.AddrPort
	if s := p.Addr().Src; s != "" {
		src, _ = parseAddr(s, 0)
	}
	pc := &pathConns{c: c, p: p}
	defer func() {
		if err != nil {
			pc.destroy()
		}
	}()
	if pc.ch, err = rdma.NewEventChannel(); err != nil {
		return nil, err
	}
	if err = pc.ch.SetNonblock(true); err != nil {
		return nil, err
	}
	cidNum := cfg.CIDNum()
	auth := rtrs.NewClientAuth(cfg.Key)
	for cid := 0; cid < cidNum; cid++ {
		if err := ctx.Err(); err != nil { // the session closing
			return nil, fmt.Errorf("rtrs/rdmatr: cid %d: %w", cid, err)
		}
		to := cfg.Timeout
		if d, ok := ctx.Deadline(); ok {
			if to = time.Until(d); to <= 0 {
				return nil, fmt.Errorf("rtrs/rdmatr: cid %d: %w", cid, context.DeadlineExceeded)
			}
		}
		id, err := pc.ch.NewID(rdma.PSTCP)
		if err != nil {
			return nil, err
		}
		if err := id.ResolveAddr(src, dst, to); err != nil {
			id.Destroy()
			return nil, err
		}
		if _, err := expectCM(pc.ch, rdma.EventAddrResolved, to); err != nil {
			id.Destroy()
			return nil, err
		}
		if err := id.ResolveRoute(to); err != nil {
			id.Destroy()
			return nil, err
		}
		if _, err := expectCM(pc.ch, rdma.EventRouteResolved, to); err != nil {
			id.Destroy()
			return nil, err
		}
		if pc.pd == nil {
			if pc.pd, err = id.Context().AllocPD(); err != nil {
				id.Destroy()
				return nil, err
			}
		}
		sendWR, recvWR := 2*rtrs.ServiceConQueueDepth+2, 2*rtrs.ServiceConQueueDepth+2
		if cid > 0 {
			qd := pc.params.QueueDepth
			sendWR, recvWR = 2*qd+2, 2*qd+2
		}
		cn, err := newConn(id, pc.pd, uint16(cid), sendWR, recvWR, 0, cid == 0)
		if err != nil {
			id.Destroy()
			return nil, err
		}
		if cid == 0 {
			pc.svc = cn
		} else {
			pc.io = append(pc.io, cn)
		}
		req := p.ConnReq(cid)
		auth.AddToConnReq(&req)
		var b [rtrs.ConnReqSize]byte
		req.MarshalTo(b[:])
		if err := id.Connect(rdma.ConnParam{PrivateData: b[:], RetryCount: 7, RNRRetryCount: 7}); err != nil {
			return nil, err
		}
		ev, err := waitCM(pc.ch, to)
		if err != nil {
			return nil, err
		}
		var rsp rtrs.ConnRsp
		switch ev.Type {
		case rdma.EventEstablished:
		case rdma.EventRejected:
			if len(ev.PrivateData) >= rtrs.ConnRspSize && rsp.Unmarshal(ev.PrivateData) == nil && rsp.Errno < 0 {
				return nil, rtrs.ExplainRefusal(fmt.Errorf("rtrs/rdmatr: cid %d refused: %w", cid, syscall.Errno(-rsp.Errno)), cfg.Key)
			}
			return nil, fmt.Errorf("rtrs/rdmatr: cid %d rejected (status %d): %w", cid, ev.Status, syscall.ECONNRESET)
		default:
			return nil, fmt.Errorf("rtrs/rdmatr: cid %d: %v (status %d): %w", cid, ev.Type, ev.Status, syscall.ECONNRESET)
		}
		if err := rsp.Unmarshal(ev.PrivateData); err != nil || rsp.Errno != 0 {
			return nil, fmt.Errorf("rtrs/rdmatr: cid %d conn_rsp: %v: %w", cid, err, syscall.ECONNRESET)
		}
		if err := auth.CheckConnRsp(&req, &rsp); err != nil {
			return nil, fmt.Errorf("rtrs/rdmatr: %v: %w", p.Addr().Dst, err)
		}
		if cid == 0 {
			if pc.params, err = rsp.Params(); err != nil {
				return nil, fmt.Errorf("rtrs/rdmatr: cid %d: %w", cid, err)
			}
		}
	}
	if err := pc.exchangeInfo(cfg.SessName, cfg.Timeout, auth); err != nil {
		return nil, err
	}
	return pc, nil
}

// infoReqSendSize is the room for the INFO_REQ sent: with the
// authentication trailer.
const infoReqSendSize = rtrs.InfoReqSize + rtrs.InfoReqAuthSize

// exchangeInfo runs INFO_REQ/INFO_RSP on cid 0 and posts the receives.
func (pc *pathConns) exchangeInfo(sessName string, timeout time.Duration, auth *rtrs.ClientAuth) (err error) {
	qd := pc.params.QueueDepth
	rspLen := rtrs.InfoRspBufSize(qd)
	if pc.info, err = mmapRegion(infoReqSendSize + rspLen); err != nil {
		return err
	}
	if pc.infoMR, err = pc.pd.RegMR(pc.info[:cap(pc.info)], rdma.AccessLocalWrite); err != nil {
		return err
	}
	rb := rdma.NewRecvBatch(1, 1)
	defer rb.Free()
	rb.Add(infoRecvID, pc.infoMR.SGE(infoReqSendSize, rspLen))
	if _, err := rb.Post(pc.svc.qp); err != nil {
		return err
	}
	var req rtrs.InfoReq
	if err := req.SetName(sessName); err != nil {
		return err
	}
	auth.AddToInfoReq(&req)
	reqLen, err := req.MarshalTo(pc.info)
	if err != nil {
		return err
	}
	sb := rdma.NewSendBatch(1, 1)
	defer sb.Free()
	sb.Add(rdma.SendWR{Opcode: rdma.WRSend, Flags: rdma.SendSignaled}, pc.infoMR.SGE(0, reqLen))
	if _, err := sb.Post(pc.svc.qp); err != nil {
		return err
	}
	wcs := make([]rdma.WC, 4)
	deadline := time.Now().Add(timeout)
	for got := false; !got; {
		n, err := pc.svc.cq.Poll(wcs)
		if err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rdma.WCSuccess {
				return fmt.Errorf("rtrs/rdmatr: INFO exchange: %v: %w", wc.Status, syscall.ECONNRESET)
			}
			if wc.WRID == infoRecvID {
				var rsp rtrs.InfoRsp
				if err := rsp.Unmarshal(pc.info[infoReqSendSize : infoReqSendSize+int(wc.ByteLen)]); err != nil {
					return err
				}
				if err := auth.CheckInfoRsp(&rsp); err != nil {
					return fmt.Errorf("rtrs/rdmatr: %w", err)
				}
				if pc.chunks, err = rsp.ChunkBufs(qd, uint32(pc.params.ChunkSize), nil); err != nil {
					return err
				}
				got = true
			}
		}
		if n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("rtrs/rdmatr: no INFO_RSP: %w", syscall.ETIMEDOUT)
			}
			waitFd(pc.svc.cc.Fd(), 10*time.Millisecond)
			pc.svc.drainEvents()
		}
	}
	if err := pc.svc.postRecvs(0, pc.svc.nrecv); err != nil {
		return err
	}
	for _, cn := range pc.io {
		if err := cn.postRecvs(0, cn.nrecv); err != nil {
			return err
		}
	}
	return nil
}
