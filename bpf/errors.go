//go:build linux

package bpf

import "errors"

// ErrUnavailable means a program cannot be attached on this host: its
// attach point does not exist (ib_uverbs not loaded, for
// LoadCompletionCPU), or no object of it is built for this architecture
// (the completion CPU kprobe outside amd64 and arm64).
var ErrUnavailable = errors.New("attach point unavailable")
