// Package rdma is a thin interface to RDMA CM and verbs through rdma-core
// (librdmacm, libibverbs) via cgo: event channels, connection setup with
// private data, RC queue pairs, completion queues and memory registration.
//
// It knows nothing of RTRS; it is the verbs layer the rtrs package builds on.
package rdma
