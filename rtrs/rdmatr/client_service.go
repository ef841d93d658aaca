package rdmatr

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rdma"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/internal/session"
)

// Serve implements session.Conn: it runs the service connection
// (heartbeats and their answers, fences and theirs) and watches the CM
// events of the set, until the path stops.
func (pc *pathConns) Serve(p *session.Path) {
	wakeFD, err := p.WakeFD()
	if err != nil {
		pc.fail("%v", err)
		return
	}
	sb := rdma.NewSendBatch(4, 1)
	defer sb.Free()
	rb := rdma.NewRecvBatch(pc.svc.nrecv, 1)
	defer rb.Free()
	wcs := make([]rdma.WC, 32)
	fds := []unix.PollFd{{Fd: int32(pc.ch.Fd()), Events: unix.POLLIN}, {Fd: int32(pc.svc.cc.Fd()), Events: unix.POLLIN}, {Fd: int32(wakeFD), Events: unix.POLLIN}}
	fenceOut := false // one at a time: the INFO buffer carries it
	for !p.Stopping() {
		if p.HeartbeatDue(time.Now()) {
			sb.Add(rdma.SendWR{Opcode: rdma.WRWriteWithImm, Imm: rtrs.HeartbeatImm})
		}
		if !fenceOut {
			if target, ok := p.NextFence(); ok {
				// The INFO buffer is free once INFO is done.
				(&rtrs.FenceReq{SessUUID: target}).MarshalTo(pc.info)
				sb.Add(rdma.SendWR{Opcode: rdma.WRSend}, pc.infoMR.SGE(0, rtrs.FenceReqSize))
				fenceOut = true
			}
		}
		if sb.Len() > 0 {
			if _, err := sb.Post(pc.svc.qp); err != nil {
				pc.fail("service connection: %v", err)
			}
		}
		ms := max(int(time.Until(p.NextHeartbeat())/time.Millisecond), 0)
		unix.Poll(fds, ms)
		var b [8]byte
		unix.Read(wakeFD, b[:])
		for {
			ev, err := pc.ch.GetEvent()
			if err != nil {
				break
			}
			ev.Ack()
			switch ev.Type {
			case rdma.EventDisconnected, rdma.EventConnectError, rdma.EventUnreachable, rdma.EventRejected,
				rdma.EventAddrChange, rdma.EventTimewaitExit, rdma.EventDeviceRemoval:
				pc.fail("%v (status %d)", ev.Type, ev.Status)
			}
		}
		if err := pc.svc.drainEvents(); err != nil {
			pc.fail("service connection: %v", err)
		}
		for {
			n, err := pc.svc.cq.Poll(wcs)
			if err != nil {
				pc.fail("service connection: %v", err)
				break
			}
			for _, wc := range wcs[:n] {
				if wc.Status != rdma.WCSuccess {
					pc.fail("service connection: %v: %v", wc.Opcode, wc.Status)
					continue
				}
				if wc.Opcode&rdma.WCRecv == 0 {
					continue
				}
				p.Alive()
				rb.Add(wc.WRID, pc.svc.recvSGE(int(wc.WRID)))
				if !wc.HasImm() {
					continue
				}
				switch t, v := rtrs.SplitImm(wc.Imm); t {
				case rtrs.ImmHBMsg:
					sb.Add(rdma.SendWR{Opcode: rdma.WRWriteWithImm, Imm: rtrs.HeartbeatAckImm})
				case rtrs.ImmHBAck:
					p.HeartbeatAcked()
				case rtrs.ImmFenceRsp:
					if fenceOut {
						fenceOut = false
						p.FenceAnswered(int(v))
					}
				}
			}
			if n < len(wcs) {
				break
			}
		}
		if rb.Len() > 0 {
			if _, err := rb.Post(pc.svc.qp); err != nil {
				pc.fail("service connection: %v", err)
			}
		}
	}
}
