// Package clientq is the transport-neutral half of an RTRS client's
// per-CPU queue, shared by rtrs/tcp and rtrs/rdmatr.
//
// Core is the skeleton of one queue: its connections by path, the policy
// that picks one, its requests (RequestQueue: permits, the waiting list,
// failover with the same permit, completion with statistics), the
// connections whose requests wait for their path to be fenced, the
// Mailbox through which the session's control messages (a connection
// handed over or taken back, a fence, a policy, close) reach the queue's
// thread, and the io_uring event loop. A transport gives it a Transport:
// how to take a connection, encode and queue a request, write out what
// was queued, fail a connection, and handle its own ring entries.
//
// Everything but the Post methods, Do and the Mailbox runs on the
// queue's thread, takes no lock and allocates nothing per request.
//
// It knows nothing of sockets, verbs or the wire's framing; the session
// layer (rtrs/internal/session) knows nothing of it.
package clientq
