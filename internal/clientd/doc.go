// Package clientd is the client daemon: what a map request names
// (MapSpec, ParseMapString), the daemon's state (Registry: its RNBD
// sessions and mapped devices, map, unmap, list and the recovery of
// devices a dead daemon left, Records), and the protocol between the CLI
// and the daemon on its unix socket (Request, Reply, Ask, Serve).
//
// It knows nothing of the command line: cmd/urnbd parses flags, runs the
// socket's accept loop, the observers (eBPF, metrics) and prints.
package clientd
