package rdma

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include "crdma.h"
*/
import "C"

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EventType is the type of a CM event (enum rdma_cm_event_type).
type EventType int

// CM event types.
const (
	EventAddrResolved    EventType = C.RDMA_CM_EVENT_ADDR_RESOLVED
	EventAddrError       EventType = C.RDMA_CM_EVENT_ADDR_ERROR
	EventRouteResolved   EventType = C.RDMA_CM_EVENT_ROUTE_RESOLVED
	EventRouteError      EventType = C.RDMA_CM_EVENT_ROUTE_ERROR
	EventConnectRequest  EventType = C.RDMA_CM_EVENT_CONNECT_REQUEST
	EventConnectResponse EventType = C.RDMA_CM_EVENT_CONNECT_RESPONSE
	EventConnectError    EventType = C.RDMA_CM_EVENT_CONNECT_ERROR
	EventUnreachable     EventType = C.RDMA_CM_EVENT_UNREACHABLE
	EventRejected        EventType = C.RDMA_CM_EVENT_REJECTED
	EventEstablished     EventType = C.RDMA_CM_EVENT_ESTABLISHED
	EventDisconnected    EventType = C.RDMA_CM_EVENT_DISCONNECTED
	EventDeviceRemoval   EventType = C.RDMA_CM_EVENT_DEVICE_REMOVAL
	EventMulticastJoin   EventType = C.RDMA_CM_EVENT_MULTICAST_JOIN
	EventMulticastError  EventType = C.RDMA_CM_EVENT_MULTICAST_ERROR
	EventAddrChange      EventType = C.RDMA_CM_EVENT_ADDR_CHANGE
	EventTimewaitExit    EventType = C.RDMA_CM_EVENT_TIMEWAIT_EXIT
)

// String returns librdmacm's name of the event (rdma_event_str), e.g.
// "RDMA_CM_EVENT_ESTABLISHED".
func (t EventType) String() string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(t)))
}

// PortSpace is an RDMA CM port space (enum rdma_port_space).
type PortSpace int

// Port spaces. RTRS uses PSTCP: reliable connected QPs.
const (
	PSTCP PortSpace = C.RDMA_PS_TCP
	PSIB  PortSpace = C.RDMA_PS_IB
)

// EventChannel is an RDMA CM event channel (struct rdma_event_channel):
// the file descriptor on which the CM reports events of the ids created
// on it.
type EventChannel struct {
	ch *C.struct_rdma_event_channel
}

// NewEventChannel opens an event channel (rdma_create_event_channel).
func NewEventChannel() (*EventChannel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, fmt.Errorf("rdma_create_event_channel: %w", errnoOf(err))
	}
	return &EventChannel{ch: ch}, nil
}

// Fd returns the channel's file descriptor. It is readable when an event
// is pending, so it can be waited on with poll(2), epoll or io_uring
// (IORING_OP_POLL_ADD) before calling GetEvent.
func (c *EventChannel) Fd() int { return int(c.ch.fd) }

// SetNonblock puts the channel's fd in (or out of) non-blocking mode. In
// non-blocking mode GetEvent returns an error wrapping unix.EAGAIN when
// no event is pending.
func (c *EventChannel) SetNonblock(nonblocking bool) error {
	if err := unix.SetNonblock(c.Fd(), nonblocking); err != nil {
		return fmt.Errorf("rdma: event channel fd %d: set nonblock: %w", c.Fd(), err)
	}
	return nil
}

// Close destroys the channel (rdma_destroy_event_channel). All ids on it
// must have been destroyed first.
func (c *EventChannel) Close() error {
	if c.ch == nil {
		return ErrClosed
	}
	C.rdma_destroy_event_channel(c.ch)
	c.ch = nil
	return nil
}

// Event is a CM event, with its private data copied out. It must be
// acknowledged with Ack; rdma-core's rdma_destroy_id waits for all events
// of an id to be acknowledged.
type Event struct {
	Type EventType
	// ID is the id the event is about. For EventConnectRequest it is a
	// new id for the incoming connection, a child of the listening id
	// (ListenID), on the listener's event channel: Accept or Reject it.
	ID *CMID
	// ListenID is the listening id, for EventConnectRequest.
	ListenID *CMID
	// Status is the event's status: 0, a negative errno (e.g. for
	// EventAddrError, EventConnectError, EventUnreachable), or for
	// EventRejected the transport's reject reason (for IB/RoCE
	// 28 means "consumer defined": the peer called Reject).
	Status int
	// PrivateData is a copy of the private data carried by a connect
	// request, response or reject. Its length is what the transport
	// reports: over IB/RoCE that is the fixed maximum of the message (56
	// bytes for a request in the TCP port space, 196 for an accept, 148 for
	// a reject), the data the peer sent followed by zeros, so a protocol
	// must carry its own lengths.
	PrivateData []byte
	// Connection parameters of a connect request or response.
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	QPNum              uint32

	ev *C.struct_rdma_cm_event
}

// Ack acknowledges the event (rdma_ack_cm_event). The event's fields stay
// valid; they were copied.
func (e *Event) Ack() error {
	if e.ev == nil {
		return ErrClosed
	}
	ret, err := C.rdma_ack_cm_event(e.ev)
	e.ev = nil
	if ret != 0 {
		return fmt.Errorf("rdma_ack_cm_event %v: %w", e.Type, errnoOf(err))
	}
	return nil
}

// String describes the event for logs.
func (e *Event) String() string {
	return fmt.Sprintf("%v status %d", e.Type, e.Status)
}

// ids maps rdma-core's ids to ours, so that events can name them.
var ids struct {
	sync.Mutex
	m map[*C.struct_rdma_cm_id]*CMID
}

func lookupID(p *C.struct_rdma_cm_id, ch *EventChannel) *CMID {
	if p == nil {
		return nil
	}
	ids.Lock()
	defer ids.Unlock()
	if id := ids.m[p]; id != nil {
		return id
	}
	id := &CMID{id: p, ch: ch}
	ids.m[p] = id
	return id
}

func init() { ids.m = make(map[*C.struct_rdma_cm_id]*CMID) }

func registerID(id *CMID) {
	ids.Lock()
	ids.m[id.id] = id
	ids.Unlock()
}

// GetEvent returns the next event on the channel (rdma_get_cm_event),
// blocking unless the channel is non-blocking.
func (c *EventChannel) GetEvent() (*Event, error) {
	if c.ch == nil {
		return nil, ErrClosed
	}
	var out C.struct_urnbd_cm_event
	ret, err := C.urnbd_get_cm_event(c.ch, &out)
	if ret != 0 {
		return nil, fmt.Errorf("rdma_get_cm_event: %w", errnoOf(err))
	}
	e := &Event{
		Type:               EventType(out._type),
		Status:             int(out.status),
		ResponderResources: uint8(out.responder_resources),
		InitiatorDepth:     uint8(out.initiator_depth),
		RetryCount:         uint8(out.retry_count),
		RNRRetryCount:      uint8(out.rnr_retry_count),
		QPNum:              uint32(out.qp_num),
		ev:                 out.ev,
	}
	e.ID = lookupID(out.id, c)
	e.ListenID = lookupID(out.listen_id, c)
	if out.private_data != nil && out.private_data_len > 0 {
		e.PrivateData = C.GoBytes(out.private_data, C.int(out.private_data_len))
	}
	return e, nil
}

// CMID is an RDMA CM identifier (struct rdma_cm_id), the CM's analogue of
// a socket. Its calls are asynchronous: each one's outcome arrives as an
// event on its event channel.
type CMID struct {
	id *C.struct_rdma_cm_id
	ch *EventChannel
	qp *QP
}

// NewID creates an id on the channel in port space ps (rdma_create_id).
func (c *EventChannel) NewID(ps PortSpace) (*CMID, error) {
	if c.ch == nil {
		return nil, ErrClosed
	}
	var p *C.struct_rdma_cm_id
	ret, err := C.rdma_create_id(c.ch, &p, nil, C.enum_rdma_port_space(ps))
	if ret != 0 {
		return nil, fmt.Errorf("rdma_create_id: %w", errnoOf(err))
	}
	id := &CMID{id: p, ch: c}
	registerID(id)
	return id, nil
}

// Channel returns the event channel that reports the id's events.
func (id *CMID) Channel() *EventChannel { return id.ch }

func withSockaddr(ap netip.AddrPort, f func(*C.struct_sockaddr) error) error {
	var ss C.struct_sockaddr_storage
	b := unsafe.Slice((*byte)(unsafe.Pointer(&ss)), unsafe.Sizeof(ss))
	if _, err := putSockaddr(b, ap); err != nil {
		return err
	}
	return f((*C.struct_sockaddr)(unsafe.Pointer(&ss)))
}

// Bind binds the id to a local address and port (rdma_bind_addr). Port 0
// picks a free port. Binding to a specific address also binds the id to
// that address's RDMA device.
func (id *CMID) Bind(addr netip.AddrPort) error {
	return withSockaddr(addr, func(sa *C.struct_sockaddr) error {
		ret, err := C.rdma_bind_addr(id.id, sa)
		if ret != 0 {
			return fmt.Errorf("rdma_bind_addr %s: %w", addr, errnoOf(err))
		}
		return nil
	})
}

// Listen starts listening for connect requests (rdma_listen); each
// arrives as an EventConnectRequest with a new id.
func (id *CMID) Listen(backlog int) error {
	ret, err := C.rdma_listen(id.id, C.int(backlog))
	if ret != 0 {
		return fmt.Errorf("rdma_listen %s: %w", id.LocalAddr(), errnoOf(err))
	}
	return nil
}

// ResolveAddr resolves dst (and src, if valid, as the local address) to
// an RDMA device and port (rdma_resolve_addr); EventAddrResolved or
// EventAddrError follows.
func (id *CMID) ResolveAddr(src, dst netip.AddrPort, timeout time.Duration) error {
	var ss C.struct_sockaddr_storage
	var srcp *C.struct_sockaddr
	if src.Addr().IsValid() {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&ss)), unsafe.Sizeof(ss))
		if _, err := putSockaddr(b, src); err != nil {
			return err
		}
		srcp = (*C.struct_sockaddr)(unsafe.Pointer(&ss))
	}
	return withSockaddr(dst, func(dsa *C.struct_sockaddr) error {
		ret, err := C.rdma_resolve_addr(id.id, srcp, dsa, C.int(timeout.Milliseconds()))
		if ret != 0 {
			return fmt.Errorf("rdma_resolve_addr %s: %w", dst, errnoOf(err))
		}
		return nil
	})
}

// ResolveRoute resolves the route to the destination (rdma_resolve_route);
// EventRouteResolved or EventRouteError follows.
func (id *CMID) ResolveRoute(timeout time.Duration) error {
	ret, err := C.rdma_resolve_route(id.id, C.int(timeout.Milliseconds()))
	if ret != 0 {
		return fmt.Errorf("rdma_resolve_route %s: %w", id.PeerAddr(), errnoOf(err))
	}
	return nil
}

// ConnParam are the parameters of Connect and Accept.
type ConnParam struct {
	// PrivateData goes to the peer in the connect request or response (at
	// most 56 bytes for a request, 196 for a response in the TCP port
	// space over IB/RoCE).
	PrivateData []byte
	// ResponderResources is the number of outstanding RDMA READs and
	// atomics the local side accepts from the peer; InitiatorDepth the
	// number it issues.
	ResponderResources uint8
	InitiatorDepth     uint8
	// RetryCount (Connect only) is how often a send is retried on
	// timeout (0–7); RNRRetryCount how often on a receiver-not-ready NAK
	// (0–7, 7 = forever).
	RetryCount    uint8
	RNRRetryCount uint8
}

func pdArgs(pd []byte) (unsafe.Pointer, C.int, error) {
	if len(pd) > 255 {
		return nil, 0, fmt.Errorf("rdma: %d bytes of private data, at most 255: %w", len(pd), unix.EINVAL)
	}
	if len(pd) == 0 {
		return nil, 0, nil
	}
	return unsafe.Pointer(&pd[0]), C.int(len(pd)), nil
}

// Connect connects an id whose route is resolved (rdma_connect);
// EventEstablished, EventRejected, EventConnectError or EventUnreachable
// follows. Create the QP (CreateQP) first.
func (id *CMID) Connect(p ConnParam) error {
	pd, n, err := pdArgs(p.PrivateData)
	if err != nil {
		return err
	}
	ret, cerr := C.urnbd_connect(id.id, pd, n, C.int(p.ResponderResources),
		C.int(p.InitiatorDepth), C.int(p.RetryCount), C.int(p.RNRRetryCount))
	if ret != 0 {
		return fmt.Errorf("rdma_connect %s: %w", id.PeerAddr(), errnoOf(cerr))
	}
	return nil
}

// Accept accepts a connect request on the id of an EventConnectRequest
// (rdma_accept); the id's QP must exist. RetryCount is ignored.
// EventEstablished follows.
func (id *CMID) Accept(p ConnParam) error {
	pd, n, err := pdArgs(p.PrivateData)
	if err != nil {
		return err
	}
	ret, cerr := C.urnbd_accept(id.id, pd, n, C.int(p.ResponderResources),
		C.int(p.InitiatorDepth), C.int(p.RNRRetryCount))
	if ret != 0 {
		return fmt.Errorf("rdma_accept %s: %w", id.PeerAddr(), errnoOf(cerr))
	}
	return nil
}

// Reject rejects a connect request (rdma_reject), sending privateData (at
// most 148 bytes over IB/RoCE) to the peer, which sees EventRejected.
func (id *CMID) Reject(privateData []byte) error {
	if id.id == nil {
		return ErrClosed
	}
	pd, n, err := pdArgs(privateData)
	if err != nil {
		return err
	}
	ret, cerr := C.rdma_reject(id.id, pd, C.uint8_t(n))
	if ret != 0 {
		return fmt.Errorf("rdma_reject %s: %w", id.PeerAddr(), errnoOf(cerr))
	}
	return nil
}

// Disconnect disconnects the connection (rdma_disconnect): its QP goes to
// the error state and outstanding work requests complete with flush
// errors. Over IB/RoCE it sends a DREQ; the peer sees EventDisconnected
// and answers with its own Disconnect (a DREP), upon which this side sees
// EventDisconnected too (or after the DREQ times out).
func (id *CMID) Disconnect() error {
	ret, err := C.rdma_disconnect(id.id)
	if ret != 0 {
		return fmt.Errorf("rdma_disconnect %s: %w", id.PeerAddr(), errnoOf(err))
	}
	return nil
}

// Destroy destroys the id (rdma_destroy_id), and its QP if it still has
// one. It blocks until every event reported for the id is acknowledged.
func (id *CMID) Destroy() error {
	if id.id == nil {
		return ErrClosed
	}
	if id.qp != nil {
		id.qp.Destroy()
	}
	p := id.id
	ret, err := C.rdma_destroy_id(p)
	if ret != 0 {
		return fmt.Errorf("rdma_destroy_id: %w", errnoOf(err))
	}
	ids.Lock()
	delete(ids.m, p)
	ids.Unlock()
	id.id = nil
	return nil
}

// LocalAddr returns the id's local address (rdma_get_local_addr): the
// bound or resolved source address and port. It is the zero AddrPort if
// none is set.
func (id *CMID) LocalAddr() netip.AddrPort {
	if id.id == nil {
		return netip.AddrPort{}
	}
	sa := C.rdma_get_local_addr(id.id)
	ap, _ := parseSockaddr(unsafe.Slice((*byte)(unsafe.Pointer(sa)), sizeofSockaddrInet6))
	return ap
}

// PeerAddr returns the id's destination address (rdma_get_peer_addr).
func (id *CMID) PeerAddr() netip.AddrPort {
	if id.id == nil {
		return netip.AddrPort{}
	}
	sa := C.rdma_get_peer_addr(id.id)
	ap, _ := parseSockaddr(unsafe.Slice((*byte)(unsafe.Pointer(sa)), sizeofSockaddrInet6))
	return ap
}

// Context returns the verbs device context the id is bound to (after
// Bind to a specific address, ResolveAddr, or on a connect request's id),
// or the zero Context if it is bound to none.
func (id *CMID) Context() Context {
	if id.id == nil {
		return Context{}
	}
	return Context{ctx: C.urnbd_id_verbs(id.id)}
}

// DeviceName returns the name of the RDMA device the id is bound to
// (e.g. "rxe0"), or "" if none.
func (id *CMID) DeviceName() string { return id.Context().DeviceName() }

// PortNum returns the port of the device the id is bound to (from 1), or
// 0.
func (id *CMID) PortNum() int {
	if id.id == nil {
		return 0
	}
	return int(C.urnbd_id_port(id.id))
}

// QP returns the id's queue pair created by CreateQP, or nil.
func (id *CMID) QP() *QP { return id.qp }
