// Package session is the client session layer that the RTRS transports
// share: a session's paths and the one state machine each path runs
// (connect, serve, fail, fence, reconnect, follow the user's commands), the
// control plane of a session (AddPath … Close, Paths, SetPolicy,
// max_reconnect_attempts, the Link that holds IO after a reconnect), the
// heartbeat rule and the fence protocol's client side.
//
// A transport (rtrs/tcp, rtrs/rdmatr) supplies only what differs: how to
// connect a path and serve its service connection (Conn), and how to tell
// its queues about paths (Transport). It owns its queues and datapath;
// this package never touches a request. It knows nothing of sockets or
// verbs.
//
// # Decisions where the transports once disagreed
//
//   - DialClient starts every path at once and returns as soon as one has
//     connected; the others go on in the background. It fails with every
//     path's reason when each first attempt failed (or ctx ended first).
//   - A path that fails an attempt retries after ReconnectDelay plus 0..7
//     ms of jitter in whole milliseconds (the kernel's RTRS_RECONNECT_SEED),
//     until MaxReconnectAttempts failed attempts in a row; then it stays
//     disconnected until ReconnectPath. This holds for a path's first
//     connect too.
//   - stats/reconnects counts every connect but the path's first as a
//     success, and every failed attempt but the path's first as a failure.
//   - A reconnect whose server announces other session parameters (queue
//     depth, sizes, flags) is refused and the path stays disconnected: the
//     queues' permits and buffers were sized for the first ones (the
//     kernel disables reconnect when the depth changes).
//   - FirstConn (may create the session on the server) is set on every
//     connect but the first ones of a path added by AddPath before it ever
//     connected, so that an added path joins the session and never makes
//     a new one, while a restarted server is found again by any path.
//   - A heartbeat goes every HeartbeatInterval; anything received on the
//     path (heartbeat answers, IO completions) counts as life; more than
//     MissedHeartbeats intervals without any fail the path.
//   - Fence requests go one at a time per service connection.
//   - Logf is told every path failure, every new reason for a failed
//     connect attempt, and a path giving up, on every transport.
package session
