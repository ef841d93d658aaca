package clientd

import (
	"encoding/json"
	"net"

	"github.com/urnbd/urnbd/internal/ctlsock"
)

// The CLI sends the daemon one JSON Request per connection on a root-only
// unix socket and reads one Reply.

// Request is a request to the daemon.
type Request struct {
	Op     string   `json:"op"` // map, unmap, resize, list, stats, path, session-set, handover
	Spec   *MapSpec `json:"spec,omitempty"`
	Queues int      `json:"queues,omitempty"`
	// SessionDevices is --session-devices: 0 when not given.
	SessionDevices int    `json:"session_devices,omitempty"`
	Depth          int    `json:"depth,omitempty"`
	ZeroCopy       bool   `json:"zero_copy,omitempty"` // map --zero-copy
	Device         uint32 `json:"device,omitempty"`
	Force          bool   `json:"force,omitempty"`
	// Size is a resize request's size in bytes: 0 for the server's.
	Size uint64 `json:"size,omitempty"`
	// TimeoutMS bounds a handover's wait for the requests in flight.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// path and session-set requests
	Session string `json:"session,omitempty"`
	PathOp  string `json:"path_op,omitempty"`
	Path    string `json:"path,omitempty"`
	Key     string `json:"key,omitempty"`
	Value   string `json:"value,omitempty"`
}

// Reply is the daemon's answer.
type Reply struct {
	ctlsock.Status
	Device string `json:"device,omitempty"`
	// Size is the size a resize set, in bytes.
	Size    uint64      `json:"size,omitempty"`
	Devices []ListEntry `json:"devices,omitempty"`
	// Stats is the stats request's report, as the daemon encoded it.
	Stats json.RawMessage `json:"stats,omitempty"`
	// Handover: how each device was left, and what the daemon was run
	// with, for the CLI to start the next one the same way.
	Handover   []HandoverEntry `json:"handover,omitempty"`
	DaemonArgs []string        `json:"daemon_args,omitempty"`
	Persist    bool            `json:"persist,omitempty"`
}

// HandoverEntry is how a handover left one device.
type HandoverEntry struct {
	Device string `json:"devname"`
	// Quiesced: the ublk driver stopped handing out requests
	// (QUIESCE_DEV); otherwise the queues held back what arrived.
	Quiesced bool `json:"quiesced"`
	// Error is why the handover of the device did not end cleanly:
	// requests still in flight when the daemon exits are issued again to
	// the next daemon.
	Error string `json:"error,omitempty"`
}

// ListEntry is one mapped device, as list shows it.
type ListEntry struct {
	Device     string   `json:"devname"`
	SessName   string   `json:"sessname"`
	MapPath    string   `json:"mapping_path"`
	AccessMode string   `json:"access_mode"`
	State      string   `json:"state"`
	Paths      []string `json:"paths"`
	Transport  string   `json:"transport"`
	// UblkFeatures are the ublk driver features the device was created
	// with (negotiated with this kernel's driver).
	UblkFeatures []string `json:"ublk_features"`
}

// Error is an error that a daemon reported: its text, and its errno (0
// for none), which errors.Is finds.
type Error = ctlsock.Error

// ErrNoDaemon is what Ask's error wraps when no daemon listens on the
// socket (nothing sent: a request is never half sent to a daemon).
var ErrNoDaemon = ctlsock.ErrNoListener

// Ask sends req to the daemon listening on socket and returns its reply;
// an error the daemon reported is an *Error, and one for a socket that
// nobody listens on wraps ErrNoDaemon (and the dial's errno).
func Ask(socket string, req *Request) (*Reply, error) {
	var rep Reply
	if err := ctlsock.Ask(socket, "client daemon", req, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// Serve reads one request from conn, has handle answer it and writes the
// reply: handle's error goes into it, with its errno if it wraps one. A
// request that does not decode gets an EINVAL reply.
func Serve(conn net.Conn, handle func(*Request) (*Reply, error)) {
	ctlsock.Serve(conn, "client daemon", handle, func() *Reply { return &Reply{} })
}
