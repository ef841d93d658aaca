package rdmatr

// CQInfo describes the completion queue of one connection of a client
// session, for tools that follow where the kernel raises its completion
// events (eBPF on ib_uverbs_comp_handler, cpu_migration statistics).
type CQInfo struct {
	// Path is the path's index (Client.Paths), PathAddr its name.
	Path     int
	PathAddr string
	// Queue is the client queue the connection belongs to (Client.Queue),
	// or -1 for the path's service connection (cid 0, heartbeats).
	Queue int
	// UserHandle is the CQ's user_handle, as the kernel's ib_cq holds it
	// in cq->uobject->uevent.uobject.user_handle (rdma.CQ.UserHandle).
	UserHandle uint64
}

// CompletionQueues lists the CQs of every connection of every connected
// path: one per connection, the service connection's first. A path that
// reconnects gets new CQs (new handles); a path that is down has none.
func (c *Client) CompletionQueues() []CQInfo {
	var out []CQInfo
	for i := range c.live {
		if pc := c.live[i].Load(); pc != nil {
			out = append(out, pc.cqs...)
		}
	}
	return out
}

// cqInfos records the CQ handles of a connected set, while its CQs exist:
// CompletionQueues reads the copy, never the CQs, so it may run while the
// path goroutine frees them.
func (pc *pathConns) cqInfos() []CQInfo {
	idx, addr := pc.p.Index(), pc.p.Addr().String()
	out := make([]CQInfo, 0, 1+len(pc.io))
	out = append(out, CQInfo{Path: idx, PathAddr: addr, Queue: -1, UserHandle: pc.svc.cq.UserHandle()})
	for i, cn := range pc.io {
		out = append(out, CQInfo{Path: idx, PathAddr: addr, Queue: i, UserHandle: cn.cq.UserHandle()})
	}
	return out
}
