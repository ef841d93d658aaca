// Package bpf holds urnbd's eBPF programs, their generated Go bindings and
// loaders: IRQ-to-CPU migration of RDMA completions and latency histograms.
package bpf
