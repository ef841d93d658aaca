package rnbd

import (
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/urnbd/urnbd/rtrs"
)

// ExportStatus is what the server's operator interface shows of an export
// that sessions have open: the kernel's
// /sys/class/rnbd-server/ctl/devices/<device>/.
type ExportStatus struct {
	Path     string // the file or block device opened (block_dev)
	Sessions []ExportSessionStatus
}

// ExportSessionStatus is one session's mapping of an export: the kernel's
// devices/<device>/sessions/<session>/.
type ExportSessionStatus struct {
	Session     string
	DeviceID    uint32 // the id the session knows it by
	AccessMode  AccessMode
	ReadOnly    bool   // read_only: the mapping takes no writes
	MappingPath string // the device_path the client opened (mapping_path)
}

// Exports returns the exports open in some session, by path.
func (s *Server) Exports() []ExportStatus {
	byPath := map[string]*ExportStatus{}
	s.mu.Lock()
	s.sessions.Range(func(_, v any) bool {
		sess := v.(*serverSession)
		for id, d := range sess.table() {
			if d == nil {
				continue
			}
			e := byPath[d.exp.path]
			if e == nil {
				e = &ExportStatus{Path: d.exp.path}
				byPath[d.exp.path] = e
			}
			e.Sessions = append(e.Sessions, ExportSessionStatus{Session: sess.name, DeviceID: uint32(id),
				AccessMode: d.mode, ReadOnly: d.mode == AccessRO || d.be.readOnly, MappingPath: d.name})
		}
		return true
	})
	s.mu.Unlock()
	out := make([]ExportStatus, 0, len(byPath))
	for _, e := range byPath {
		slices.SortFunc(e.Sessions, func(a, b ExportSessionStatus) int { return strings.Compare(a.Session, b.Session) })
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b ExportStatus) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// ForceClose closes the mappings of the export named export (its path as
// Exports shows it, or the mapping path a session opened it by) in the
// session named session, or in every session when session is "", as the
// kernel's force_close does: the session's requests on it fail from then
// on (ENOTCONN, as for a device it never opened), after those running are
// done. It returns how many it closed, or ENOENT for none.
func (s *Server) ForceClose(export, session string) (int, error) {
	n := s.closeMappings(func(_ *rtrs.ServerSession, sess *serverSession, d *mapping) bool {
		if (session != "" && sess.name != session) || (d.exp.path != export && d.name != export) {
			return false
		}
		s.logf("rnbd: session %s: %s closed by the operator", sess.name, d.exp.path)
		return true
	})
	if n == 0 {
		if session != "" {
			return 0, fmt.Errorf("session %q has no export %q open: %w", session, export, syscall.ENOENT)
		}
		return 0, fmt.Errorf("no session has export %q open: %w", export, syscall.ENOENT)
	}
	return n, nil
}

// closeMappings closes the mappings that drop picks, as a CLOSE from
// their session would (after the requests running on them), and returns
// how many. drop runs under s.mu.
func (s *Server) closeMappings(drop func(rs *rtrs.ServerSession, sess *serverSession, d *mapping) bool) int {
	type closing struct {
		sess *serverSession
		d    *mapping
	}
	var cs []closing
	s.mu.Lock()
	s.sessions.Range(func(k, v any) bool {
		rs, sess := k.(*rtrs.ServerSession), v.(*serverSession)
		for id, d := range sess.table() {
			if d != nil && drop(rs, sess, d) {
				cs = append(cs, closing{sess, s.detachDevice(sess, uint32(id))})
			}
		}
		return true
	})
	s.mu.Unlock()
	for _, c := range cs {
		s.finishClose(c.sess, c.d)
	}
	return len(cs)
}

// SetPolicy replaces the server's policy (nil: every client may open
// every export) and closes the mappings that it no longer allows, as
// ForceClose does; the others stay open. It returns how many it closed.
func (s *Server) SetPolicy(p *Policy) int {
	s.policy.Store(p)
	if p == nil {
		return 0
	}
	return s.closeMappings(func(rs *rtrs.ServerSession, sess *serverSession, d *mapping) bool {
		peer := peerOf(rs, sess.name)
		err := p.Allow(peer, d.name, d.mode)
		if err != nil {
			s.logf("rnbd: audit: mapping closed by the new policy: %v, export %q, access mode %s: %v", peer, d.name, d.mode, err)
		}
		return err != nil
	})
}
