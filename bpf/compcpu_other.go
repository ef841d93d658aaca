//go:build linux && !(amd64 || arm64)

package bpf

import "fmt"

// CompletionCPU counts on which CPU the completions of user-space CQs
// land. On this architecture there is no build of its kprobe program
// (which reads its argument from the registers), so LoadCompletionCPU
// always fails with ErrUnavailable.
type CompletionCPU struct{}

// LoadCompletionCPU fails with ErrUnavailable on this architecture.
func LoadCompletionCPU(Options) (*CompletionCPU, error) {
	return nil, fmt.Errorf("ib_uverbs_comp_handler: no kprobe program built for this architecture: %w", ErrUnavailable)
}

// PerCPU is never reached: LoadCompletionCPU fails.
func (c *CompletionCPU) PerCPU() ([]uint64, error) { return nil, ErrUnavailable }

// CQs is never reached: LoadCompletionCPU fails.
func (c *CompletionCPU) CQs() ([]CQCount, error) { return nil, ErrUnavailable }

// Reset is never reached: LoadCompletionCPU fails.
func (c *CompletionCPU) Reset() error { return ErrUnavailable }

// Close does nothing.
func (c *CompletionCPU) Close() error { return nil }
