// Package clientd is the client daemon's library: what a map request
// names (MapSpec, ParseMapString), the records from which a daemon
// recovers the devices that a dead one left (Records), the protocol
// between the CLI and the daemon on its unix socket (Request, Reply, Ask,
// Serve), and the RNBD session a map request makes (Dial, Fits).
//
// It knows nothing of the command line (cmd/urnbd parses flags and
// prints) and holds no daemon state.
package clientd
