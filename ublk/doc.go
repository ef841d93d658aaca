// Package ublk is the userspace side of the Linux ublk driver (ublk_drv): its
// UAPI, the control device (/dev/ublk-control) driven through io_uring
// URING_CMD, and the per-queue I/O path that serves block requests.
//
// One Device has one Queue per hardware queue, by default one per CPU. Each
// Queue runs on its own OS thread, locked and pinned to the CPUs that the
// kernel maps to that queue, around one io_uring: ublk FETCH_REQ and
// COMMIT_AND_FETCH_REQ commands, and whatever a Target submits (backend I/O,
// a poll on a socket or completion-channel fd), all complete into that ring,
// whose wait is the queue's only blocking point.
//
// Per-tag I/O buffers are carved from a region that the caller may supply, so
// that a transport can register the same memory for RDMA (zero copy).
//
// The package knows nothing of RTRS, RNBD or any network: a Target is the
// boundary. Baseline kernel: Linux 6.12, whose UAPI uapi.go mirrors;
// features are negotiated with GET_FEATURES.
package ublk
