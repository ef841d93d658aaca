// Package ctlsock is the request and reply exchange of urnbd's control
// sockets (the client daemon's, the server's admin socket): one JSON
// request, one JSON reply per connection, an error carried as its text
// and errno. It knows nothing of what the requests mean.
package ctlsock

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Status is the error part of a reply; every reply type embeds it, so
// that its fields sit at the top of the reply's JSON object.
type Status struct {
	Error string `json:"error,omitempty"`
	Errno int    `json:"errno,omitempty"`
}

func (s *Status) status() *Status { return s }

// Reply is a reply type: one that embeds Status.
type Reply interface{ status() *Status }

// Error is an error that the far end reported: its text, and its errno
// (0 for none), which errors.Is finds.
type Error struct {
	Msg   string
	Errno syscall.Errno
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the errno, or nil.
func (e *Error) Unwrap() error {
	if e.Errno == 0 {
		return nil
	}
	return e.Errno
}

// ErrNoListener is what Ask's error wraps when nothing listens on the
// socket: nothing was sent, so a request is never half carried out.
var ErrNoListener = errors.New("nothing listens")

// Ask sends req to whoever listens on socket (name says who, for errors)
// and decodes the answer into rep. An error reported by the far end is an
// *Error; one for a socket that nobody listens on wraps ErrNoListener and
// the dial's errno.
func Ask(socket, name string, req any, rep Reply) error {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("%w: no %s on %s: %w", ErrNoListener, name, socket, err)
	}
	defer conn.Close()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fmt.Errorf("%s on %s: %w", name, socket, err)
	}
	if err := json.NewDecoder(conn).Decode(rep); err != nil {
		return fmt.Errorf("%s: no answer: %w", name, err)
	}
	if st := rep.status(); st.Error != "" {
		return &Error{Msg: st.Error, Errno: syscall.Errno(st.Errno)}
	}
	return nil
}

// Serve reads one request from conn into a new Q, has handle answer it
// and writes the reply: handle's error goes into it, with its errno if it
// wraps one. A request that does not decode gets an EINVAL reply (name
// says who refuses it). Serve closes conn.
func Serve[Q any, R Reply](conn net.Conn, name string, handle func(*Q) (R, error), empty func() R) {
	defer conn.Close()
	var req Q
	var rep R
	var err error
	if derr := json.NewDecoder(conn).Decode(&req); derr != nil {
		err = fmt.Errorf("%s: bad request: %v: %w", name, derr, syscall.EINVAL)
	} else {
		rep, err = handle(&req)
	}
	var none R
	if any(rep) == any(none) { // handle gave no reply
		rep = empty()
	}
	if err != nil {
		st := rep.status()
		st.Error = err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			st.Errno = int(errno)
		}
	}
	_ = json.NewEncoder(conn).Encode(rep)
}
