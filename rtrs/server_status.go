package rtrs

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ServerSessionStatus is what the server's operator interface shows of a
// session: the kernel's /sys/class/rtrs-server/<session>/.
type ServerSessionStatus struct {
	Name      string
	PathsUUID UUID
	// Identity is the key the session's paths proved, "" for none;
	// CertName the client certificate they showed (TLS).
	Identity, CertName string
	// Lingering: no path is left, and the session waits for its client
	// to come back until the table's linger time ends.
	Lingering bool
	Paths     []ServerPathStatus
}

// ServerPathStatus is one path of a ServerSessionStatus: the kernel's
// paths/<src@dst>/.
type ServerPathStatus struct {
	Name     string // "src@dst", as the kernel names the path's folder
	SessUUID UUID
	Src, Dst netip.AddrPort
	State    ServerPathState
	CIDNum   int
	// Details is what the path's transport adds; zero if it adds nothing.
	Details PathDetails
}

// PathDetails is what a transport tells of a server path beyond the
// session layer's view.
type PathDetails struct {
	Transport string // "rdma" or "tcp"
	HCAName   string // the RDMA device (hca_name); "" over TCP
	HCAPort   int    // its port (hca_port)
	// Stats are the path's counters (stats/rdma, stats/wc_completion),
	// nil where the transport keeps none.
	Stats *ServerPathStats
}

// PathDetailer is a PathOwner that tells its PathDetails.
type PathDetailer interface {
	PathDetails() PathDetails
}

// ServerPathName is the kernel's name of a path's folder: "src@dst",
// without ports (the kernel's ip:ADDR form is the client's syntax).
func ServerPathName(src, dst netip.AddrPort) string {
	return src.Addr().Unmap().String() + "@" + dst.Addr().Unmap().String()
}

// Status returns the table's sessions that have a name (those whose first
// path completed establishment), by name.
func (t *ServerTable) Status() []ServerSessionStatus {
	t.mu.Lock()
	out := make([]ServerSessionStatus, 0, len(t.byName))
	var owners [][]PathOwner // by session and path, as in out
	for _, sess := range t.byName {
		st := ServerSessionStatus{Name: sess.name, PathsUUID: sess.pathsUUID, Identity: sess.id.key, CertName: sess.id.cert, Lingering: sess.state == sessionLingering}
		var os []PathOwner
		for _, p := range sess.paths {
			st.Paths = append(st.Paths, ServerPathStatus{Name: ServerPathName(p.src, p.dst), SessUUID: p.sessUUID,
				Src: p.src, Dst: p.dst, State: p.State(), CIDNum: p.cidNum})
			os = append(os, p.owner)
		}
		out, owners = append(out, st), append(owners, os)
	}
	t.mu.Unlock()
	// The transports' details are taken outside the table's lock: they
	// take their own.
	for i := range out {
		for j, o := range owners[i] {
			if d, ok := o.(PathDetailer); ok {
				out[i].Paths[j].Details = d.PathDetails()
			}
		}
	}
	slices.SortFunc(out, func(a, b ServerSessionStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// DisconnectPath closes the path named path ("src@dst", or its index in
// the session's Status) of the session named name, as writing 1 to the
// kernel's paths/<src@dst>/disconnect does: the client reconnects it. It
// returns ENOENT for no such session or path.
func (t *ServerTable) DisconnectPath(name, path string) error {
	p, err := t.lookupPath(name, path)
	if err != nil {
		return err
	}
	p.owner.ClosePath()
	return nil
}

// ResetPathStats clears the statistics of a path named as for
// DisconnectPath, as writing to the kernel's stats/reset_all does. It
// returns ENOENT for no such session or path, and EOPNOTSUPP for a path
// whose transport keeps none.
func (t *ServerTable) ResetPathStats(name, path string) error {
	p, err := t.lookupPath(name, path)
	if err != nil {
		return err
	}
	if d, ok := p.owner.(PathDetailer); ok {
		if d := d.PathDetails(); d.Stats != nil {
			d.Stats.ResetAll()
			return nil
		}
	}
	return fmt.Errorf("path %s of session %q keeps no statistics: %w", path, name, syscall.EOPNOTSUPP)
}

// lookupPath finds the path named path (see DisconnectPath) of the
// session named name.
func (t *ServerTable) lookupPath(name, path string) (*ServerPath, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sess := t.byName[name]
	if sess == nil {
		return nil, fmt.Errorf("no session %q: %w", name, syscall.ENOENT)
	}
	for i, p := range sess.paths {
		if ServerPathName(p.src, p.dst) == path || strconv.Itoa(i) == path {
			return p, nil
		}
	}
	return nil, fmt.Errorf("session %q has no path %q: %w", name, path, syscall.ENOENT)
}

// DisconnectSession closes every path of the session named name; the
// client reconnects them (the session lingers meanwhile). It returns how
// many it closed, or ENOENT for no such session.
func (t *ServerTable) DisconnectSession(name string) (int, error) {
	t.mu.Lock()
	sess := t.byName[name]
	var owners []PathOwner
	if sess != nil {
		for _, p := range sess.paths {
			owners = append(owners, p.owner)
		}
	}
	t.mu.Unlock()
	if sess == nil {
		return 0, fmt.Errorf("no session %q: %w", name, syscall.ENOENT)
	}
	for _, o := range owners {
		o.ClosePath()
	}
	return len(owners), nil
}
