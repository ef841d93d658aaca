package clientd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/ublk"
)

// Registry is the client daemon's state: its RNBD sessions by name and
// the devices mapped through them, with their records (Records) for a
// daemon that has to recover them.
//
// Its lock is held only to look up and change the maps, never across a
// dial, a map, an unmap or a recovery (each may wait up to MapTimeout for
// a server): a map to a slow server does not hold up list, stats, an
// unmap or a map through another session. A map to a session being
// dialled waits for that dial; two maps of the same device of a session
// at once are refused (EEXIST) as a mapped one is.
type Registry struct {
	ctrl    *ublk.Control
	records Records

	// Dial opens a new session (Dial if nil).
	Dial func(ctx context.Context, spec *MapSpec, queues, devices int) (*rnbd.Client, error)
	// InUse says who holds a device open or mounted ("" if nobody): an
	// unmap without force refuses a device in use. Nil: never in use.
	InUse func(id uint32) string
	// OnSession is called, without the lock, for each session dialled.
	OnSession func(s *Session)
	// OnDevice is called, without the lock, when a device is added and
	// before one is unmapped.
	OnDevice func(id uint32, added bool)
	// Logf logs what a daemon's operator needs to know (nil: nothing).
	Logf func(format string, args ...any)

	mu       sync.Mutex
	sessions map[string]*Session
	devices  map[uint32]*Device
	mapping  map[mapKey]bool // maps and recoveries under way
}

// MapTimeout bounds a map and a recovery, dial included.
const MapTimeout = 30 * time.Second

// Session is an RNBD session of the daemon, or, before its dial is done,
// the place of one.
type Session struct {
	Spec       MapSpec // the map request that opened it
	Queues     int
	MaxDevices int
	Client     *rnbd.Client // nil until dialled

	ready   chan struct{} // closed when the dial is done
	err     error         // the dial's error
	devs    int           // devices mapped
	pending int           // maps and recoveries under way
}

// Device is a mapped device.
type Device struct {
	ID      uint32
	Spec    MapSpec
	Session *Session
	Dev     *rnbd.Device

	unmapping bool
}

type mapKey struct{ sess, dev string }

// NewRegistry returns an empty registry that maps through ctrl and keeps
// its records in recs.
func NewRegistry(ctrl *ublk.Control, recs Records) *Registry {
	return &Registry{ctrl: ctrl, records: recs, sessions: map[string]*Session{},
		devices: map[uint32]*Device{}, mapping: map[mapKey]bool{}}
}

func (r *Registry) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// Map maps the device that rec names, through its session (dialled if
// the daemon has none), with depth tags (0: the default), and records it.
func (r *Registry) Map(ctx context.Context, rec *Record, depth int) (*Device, error) {
	spec := &rec.Spec
	if err := spec.CheckMode(); err != nil {
		return nil, fmt.Errorf("map: %w", err)
	}
	d, err := r.attach(ctx, rec, func() error {
		for _, d := range r.devices {
			if d.Spec.SessName == spec.SessName && d.Spec.DevicePath == spec.DevicePath {
				return fmt.Errorf("map: %s of session %s is already mapped as %s: %w", spec.DevicePath, spec.SessName, ublk.BlockPath(d.ID), syscall.EEXIST)
			}
		}
		return nil
	}, func(ctx context.Context, s *Session) (*rnbd.Device, error) {
		dev, err := s.Client.Map(ctx, r.ctrl, spec.DevicePath, spec.Mode, rnbd.MapOptions{ID: -1, Depth: depth, ZeroCopy: rec.ZeroCopy})
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", spec.DevicePath, err)
		}
		return dev, nil
	})
	if err == nil {
		r.logf("mapped %s of session %s as %s", spec.DevicePath, spec.SessName, ublk.BlockPath(d.ID))
	}
	return d, err
}

// attach runs op, a map or a recovery of rec's device, through its
// session, within MapTimeout, and registers the device it makes. taken,
// called with the lock held, refuses a device the daemon has already;
// one being mapped or recovered is refused (EEXIST) too.
func (r *Registry) attach(ctx context.Context, rec *Record, taken func() error, op func(context.Context, *Session) (*rnbd.Device, error)) (*Device, error) {
	key := mapKey{rec.Spec.SessName, rec.Spec.DevicePath}
	r.mu.Lock()
	if err := taken(); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	if r.mapping[key] {
		r.mu.Unlock()
		return nil, fmt.Errorf("map: %s of session %s is being mapped or recovered: %w", rec.Spec.DevicePath, rec.Spec.SessName, syscall.EEXIST)
	}
	r.mapping[key] = true
	r.mu.Unlock()
	defer r.done(key)

	ctx, cancel := context.WithTimeout(ctx, MapTimeout)
	defer cancel()
	s, err := r.session(ctx, rec)
	if err != nil {
		return nil, err
	}
	dev, err := op(ctx, s)
	if err != nil {
		r.release(s)
		return nil, err
	}
	return r.add(s, rec, dev), nil
}

// done ends a map or recovery of key.
func (r *Registry) done(key mapKey) {
	r.mu.Lock()
	delete(r.mapping, key)
	r.mu.Unlock()
}

// session returns the session rec names, dialled (by this call, or by the
// one under way) and counted as pending: the caller ends with add or
// release. rec.Spec's transport is filled in.
func (r *Registry) session(ctx context.Context, rec *Record) (*Session, error) {
	spec := &rec.Spec
	r.mu.Lock()
	s := r.sessions[spec.SessName]
	if s == nil {
		s = &Session{Spec: *spec, ready: make(chan struct{})}
		s.pending++
		r.sessions[spec.SessName] = s
		r.mu.Unlock()
		return r.dial(ctx, s, rec)
	}
	s.pending++
	r.mu.Unlock()
	select {
	case <-s.ready:
	case <-ctx.Done():
		r.release(s)
		return nil, fmt.Errorf("map: session %s: waiting for its dial: %w", spec.SessName, ctx.Err())
	}
	if s.err != nil {
		r.release(s)
		return nil, s.err
	}
	if err := s.Fits(spec, rec.Queues, rec.SessionDevices); err != nil {
		r.release(s)
		return nil, err
	}
	return s, nil
}

// dial opens s, a new session's place.
func (r *Registry) dial(ctx context.Context, s *Session, rec *Record) (*Session, error) {
	dial := r.Dial
	if dial == nil {
		dial = Dial
	}
	client, err := dial(ctx, &rec.Spec, rec.Queues, rec.SessionDevices)
	r.mu.Lock()
	if err == nil {
		s.Client, s.Spec, s.Queues, s.MaxDevices = client, rec.Spec, client.Queues(), client.MaxDevices()
	} else {
		s.err = err
	}
	close(s.ready)
	r.mu.Unlock()
	if err != nil {
		r.release(s)
		return nil, err
	}
	if r.OnSession != nil {
		r.OnSession(s)
	}
	return s, nil
}

// release ends a pending use of s that mapped nothing; a session left
// without devices and pending uses is closed.
func (r *Registry) release(s *Session) {
	r.mu.Lock()
	s.pending--
	drop := r.unusedLocked(s)
	r.mu.Unlock()
	if drop && s.Client != nil {
		s.Client.Close()
	}
}

// unusedLocked forgets s if it has no device and no pending use, and
// reports whether it did.
func (r *Registry) unusedLocked(s *Session) bool {
	if s.devs > 0 || s.pending > 0 {
		return false
	}
	if r.sessions[s.Spec.SessName] == s {
		delete(r.sessions, s.Spec.SessName)
	}
	return true
}

// add registers dev, mapped through s (a pending use of it), and records
// it for a daemon that may have to recover it.
func (r *Registry) add(s *Session, rec *Record, dev *rnbd.Device) *Device {
	id := dev.UblkDevice().ID()
	d := &Device{ID: id, Spec: rec.Spec, Session: s, Dev: dev}
	r.mu.Lock()
	s.pending--
	s.devs++
	r.devices[id] = d
	r.mu.Unlock()
	if r.OnDevice != nil {
		r.OnDevice(id, true)
	}
	if err := r.records.Save(id, rec); err != nil {
		r.logf("%s cannot be recovered should this daemon die: %v", ublk.BlockPath(id), err)
	}
	return d
}

// Unmap unmaps device id; without force it refuses (EBUSY) a device in
// use, and where the ublk driver has safe stop, stops it only if no open
// came in meanwhile. It reports whether the daemon has no device left,
// and no map under way. A session left without devices is closed in the background (its
// RDMA disconnects wait for the peer).
func (r *Registry) Unmap(ctx context.Context, id uint32, force bool) (last bool, err error) {
	r.mu.Lock()
	d := r.devices[id]
	switch {
	case d == nil:
		r.mu.Unlock()
		return false, fmt.Errorf("unmap: %s is not a mapped RNBD device: %w", ublk.BlockPath(id), syscall.ENOENT)
	case d.unmapping:
		r.mu.Unlock()
		return false, fmt.Errorf("unmap: %s is being unmapped: %w", ublk.BlockPath(id), syscall.EBUSY)
	}
	d.unmapping = true
	r.mu.Unlock()
	if !force {
		// InUse names who holds the device; the driver's safe stop (7.x)
		// closes the race of an open right after that check.
		who := ""
		if r.InUse != nil {
			who = r.InUse(id)
		}
		if who == "" && d.Dev != nil {
			if err := d.Dev.UblkDevice().TryStop(); errors.Is(err, syscall.EBUSY) {
				who = "opened just now"
			}
		}
		if who != "" {
			r.mu.Lock()
			d.unmapping = false
			r.mu.Unlock()
			return false, fmt.Errorf("unmap: %s is in use (%s); close it, or unmap --force: %w", ublk.BlockPath(id), who, syscall.EBUSY)
		}
	}
	if r.OnDevice != nil {
		r.OnDevice(id, false)
	}
	err = d.Dev.Unmap(ctx)
	r.records.Remove(id)
	drop, last := r.forget(d)
	if drop {
		go d.Session.Client.Close()
	}
	r.logf("unmapped %s", ublk.BlockPath(id))
	return last, err
}

// Resize sets the size of mapped device id to the server's device size
// now, or to size bytes if size is not 0 (rnbd.Device.Resize), and returns
// the size set.
func (r *Registry) Resize(ctx context.Context, id uint32, size uint64) (uint64, error) {
	r.mu.Lock()
	d := r.devices[id]
	unmapping := d != nil && d.unmapping
	r.mu.Unlock()
	switch {
	case d == nil || d.Dev == nil:
		return 0, fmt.Errorf("resize: %s is not a mapped RNBD device: %w", ublk.BlockPath(id), syscall.ENOENT)
	case unmapping:
		return 0, fmt.Errorf("resize: %s is being unmapped: %w", ublk.BlockPath(id), syscall.EBUSY)
	}
	return d.Dev.Resize(ctx, size)
}

// UnmapAll unmaps every device, in use or not: for a daemon that stops.
func (r *Registry) UnmapAll(ctx context.Context) {
	for _, d := range r.Devices() {
		r.Unmap(ctx, d.ID, true)
	}
}

// forget removes device d from the registry and reports whether its
// session is left unused and whether the daemon is left without a device
// and without a map under way.
func (r *Registry) forget(d *Device) (unusedSession, last bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.devices, d.ID)
	d.Session.devs--
	return r.unusedLocked(d.Session), len(r.devices) == 0 && len(r.mapping) == 0
}

// HandoverAll leaves every device to the next daemon (rnbd.Device.Handover),
// keeping their records, and closes the sessions: for a daemon that exits
// to be replaced. ctx bounds the wait for the requests in flight; a device
// whose requests are not all answered by then keeps its session open.
func (r *Registry) HandoverAll(ctx context.Context) []HandoverEntry {
	var out []HandoverEntry
	keep := map[*Session]bool{} // sessions with requests still in flight
	for _, d := range r.Devices() {
		r.mu.Lock()
		busy := d.unmapping
		d.unmapping = true
		r.mu.Unlock()
		e := HandoverEntry{Device: ublk.BlockPath(d.ID)}
		if busy {
			e.Error = "it is being unmapped"
			out = append(out, e)
			continue
		}
		if r.OnDevice != nil {
			r.OnDevice(d.ID, false)
		}
		res, err := d.Dev.Handover(ctx)
		e.Quiesced = res.Quiesced
		if err != nil {
			e.Error = err.Error()
			keep[d.Session] = true
		}
		r.forget(d)
		r.logf("handed over %s (driver quiesce: %v; %v)", e.Device, e.Quiesced, err)
		out = append(out, e)
	}
	for _, s := range r.Sessions() {
		// Closing a session fails its requests in flight; those are
		// left to the process's exit, which has the kernel issue them
		// again to the next daemon.
		if !keep[s] {
			s.Client.Close()
		}
	}
	return out
}

// Devices returns the mapped devices by id.
func (r *Registry) Devices() []*Device {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Device, 0, len(r.devices))
	for _, d := range r.devices {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b *Device) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Sessions returns the dialled sessions by name.
func (r *Registry) Sessions() []*Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		if s.Client != nil {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *Session) int { return cmp.Compare(a.Spec.SessName, b.Spec.SessName) })
	return out
}

// Session returns the dialled session name; ENOENT if there is none.
func (r *Registry) Session(name string) (*Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sessions[name]; s != nil && s.Client != nil {
		return s, nil
	}
	return nil, fmt.Errorf("session %q: no such session: %w", name, syscall.ENOENT)
}

// List describes the mapped devices, as `urnbd list` shows them.
func (r *Registry) List() []ListEntry {
	var out []ListEntry
	for _, d := range r.Devices() {
		e := ListEntry{Device: ublk.BlockPath(d.ID), SessName: d.Spec.SessName, MapPath: d.Spec.DevicePath,
			AccessMode: d.Spec.AccessMode, State: "open", Transport: d.Spec.Transport}
		info, err := r.ctrl.DevInfo(d.ID)
		if (err == nil && info.State != ublk.StateLive) || !d.Dev.Open() {
			e.State = "closed"
		}
		if err == nil {
			e.UblkFeatures = ublk.FeatureNames(info.Flags)
		}
		for _, p := range d.Session.Client.Paths() {
			state := p.State
			if p.LastError != "" && p.State != "connected" {
				state += ": " + p.LastError
			}
			e.Paths = append(e.Paths, p.Addr+" ("+state+")")
		}
		out = append(out, e)
	}
	return out
}

// Recover serves again device id, which a daemon before this one left
// quiesced, from its record: its session is dialled (or shared) and the
// device reopened on the server.
func (r *Registry) Recover(ctx context.Context, id uint32) error {
	rec, err := r.records.Load(id)
	if err != nil {
		return err
	}
	_, err = r.attach(ctx, rec, func() error {
		if r.devices[id] != nil {
			return fmt.Errorf("recover %s: it is mapped: %w", ublk.BlockPath(id), syscall.EEXIST)
		}
		return nil
	}, func(ctx context.Context, s *Session) (*rnbd.Device, error) {
		dev, err := s.Client.Recover(ctx, r.ctrl, id, rec.Spec.DevicePath, rec.Spec.Mode)
		for errors.Is(err, syscall.EPERM) && ctx.Err() == nil {
			// The server still holds the dead daemon's session, and
			// with it the device's rw mapping, until it notices the loss.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			dev, err = s.Client.Recover(ctx, r.ctrl, id, rec.Spec.DevicePath, rec.Spec.Mode)
		}
		return dev, err
	})
	return err
}

// Idle reports whether the daemon has no device and no map under way.
func (r *Registry) Idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.devices) == 0 && len(r.mapping) == 0
}
