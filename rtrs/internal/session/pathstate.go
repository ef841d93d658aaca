package session

// States of a client path, as the transports report them
// (ClientPathInfo.State holds PathStateName of one).
const (
	PathStateConnecting   int32 = iota // first connect
	PathStateConnected                 // carries requests
	PathStateReconnecting              // failed, reconnecting
	PathStateDisconnected              // disconnected by the user, or reconnecting given up
	PathStateRemoved                   // removed from the session
)

// PathStateName returns "connecting", "connected", "reconnecting",
// "disconnected", "removed", or "unknown" for any other value.
func PathStateName(s int32) string {
	switch s {
	case PathStateConnecting:
		return "connecting"
	case PathStateConnected:
		return "connected"
	case PathStateReconnecting:
		return "reconnecting"
	case PathStateDisconnected:
		return "disconnected"
	case PathStateRemoved:
		return "removed"
	}
	return "unknown"
}

// PathHasHope reports whether a path in state s carries requests or may
// again without the user's help: requests wait for such a path rather
// than fail.
func PathHasHope(s int32) bool {
	switch s {
	case PathStateConnecting, PathStateConnected, PathStateReconnecting:
		return true
	}
	return false
}
