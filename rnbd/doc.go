// Package rnbd implements the RNBD block protocol of the Linux kernel,
// version 2.2 as in Linux 7.x (and 2.0 of Linux 6.12, which differs only
// in the two flags 2.1 and 2.2 added), on top of package rtrs: its wire messages,
// the server's exports and backends, and the client's device mapping.
//
// # Wire codecs
//
// RNBD messages travel as the user message of RTRS requests; responses to
// SessInfo and Open come back as the data of an RTRS READ. Each message has a
// Go type with the conventions of package rtrs:
//
//	Size() int
//	MarshalTo(b []byte) (int, error)
//	Unmarshal(b []byte) error
//
// little-endian, no allocation, input longer than the message accepted,
// reserved and padding bytes ignored, errors wrapping the shared sentinels
// ErrTruncated, ErrShortBuffer, ErrBadType and ErrOutOfRange (the same values
// as rtrs's), receiver unchanged on error.
//
// Messages: MsgHdr (PeekType for dispatch), SessInfo, SessInfoRsp, Open,
// OpenRsp, Close and IO (with RW = op + FlagSync/FlagFUA, and
// FlagPreflush/FlagNoUnmap of 2.1/2.2). The minor version is never on the
// wire: SessInfo carries the major only, a peer ignores flags it does not
// know, and a 2.1 client sends FUA beside PREFLUSH, so every pair of
// versions interoperates. AccessMode has
// String and ParseAccessMode. ResolveDevPath is the kernel server's rule
// that turns dev_search_path, the session name and Open's dev_name into the
// path to open.
//
// # Client
//
// A Client is one RNBD session over RTRS (DialTCP, DialRDMA); Map makes a
// ublk device of a device on the server, each with a block of per-CPU RTRS
// queues of its own. When the session loses all its paths and gets one
// back (a server restart), the client reopens its devices before RTRS lets
// IO go again (reopen.go).
//
// # Server
//
// A Server is the handler of one or more RTRS servers (TCP, RDMA) that
// share an rtrs.ServerTable; its state is kept per RTRS session, and
// ReleaseSession, the table's OnRelease, closes a session's devices when
// the session goes. An export is opened beneath the search path in one
// lookup (openat2 RESOLVE_BENEATH, export.go): a symlink swap cannot lead
// it out, and only regular files and block devices are opened, outside
// the server's lock. The access rules are the kernel's (one rw mapping of
// an export, two with migration), and a repeated OPEN gets the device it
// has only in the same access mode.
package rnbd
