package rtrs

// LinkEvent is a change of a client session's connectivity as a whole,
// what the kernel's RTRS client reports to RNBD as a link event.
type LinkEvent int

const (
	// LinkDisconnected: the session's last connected path went down.
	LinkDisconnected LinkEvent = iota
	// LinkReconnected: a path came up again after all were down. The
	// server may have lost the session meanwhile (a restart), and with it
	// whatever the user of the session set up on it (RNBD's open devices).
	LinkReconnected
)

func (e LinkEvent) String() string {
	if e == LinkReconnected {
		return "reconnected"
	}
	return "disconnected"
}
