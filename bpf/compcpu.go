//go:build linux && (amd64 || arm64)

package bpf

import (
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// CompletionCPU counts, with a kprobe on ib_uverbs_comp_handler, on which
// CPU the completions of user-space CQs land: the CPU whose hard IRQ
// (a real HCA's completion vector) or softirq/work item (rxe) ran the CQ's
// completion handler, which then wakes the thread waiting on the CQ's
// completion channel. Its maps:
//
//	urnbd_comp_cpu  per-CPU array[1] -> completions on that CPU
//	urnbd_cq_cpu    hash {user_handle, cpu} -> {count, comp_vector}
//
// user_handle is the address of the process's struct ibv_cq, the
// cq_context libibverbs passes to the kernel at ibv_create_cq. Comparing
// the CPU with the one that polls the CQ gives RTRS's cpu_migration.
type CompletionCPU struct {
	objs compCPUObjects
	link link.Link
	opts Options
}

// LoadCompletionCPU loads the completion CPU program and attaches it. It
// fails with ErrUnavailable when ib_uverbs is not loaded; the block
// programs do not depend on it.
func LoadCompletionCPU(opts Options) (*CompletionCPU, error) {
	if _, err := os.Stat("/sys/module/ib_uverbs"); err != nil {
		return nil, fmt.Errorf("ib_uverbs_comp_handler: module ib_uverbs is not loaded: %w", ErrUnavailable)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := loadCompCPU()
	if err != nil {
		return nil, err
	}
	copts, err := opts.collectionOptions(spec)
	if err != nil {
		return nil, err
	}
	c := &CompletionCPU{opts: opts}
	if err := spec.LoadAndAssign(&c.objs, copts); err != nil {
		return nil, fmt.Errorf("load completion CPU program: %w", err)
	}
	c.link, err = link.Kprobe("ib_uverbs_comp_handler", c.objs.UrnbdCqComp, nil)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("attach %s: %w", c.objs.UrnbdCqComp, err)
	}
	return c, nil
}

// PerCPU returns the completions counted on each possible CPU.
func (c *CompletionCPU) PerCPU() ([]uint64, error) {
	var v []uint64
	if err := c.objs.UrnbdCompCpu.Lookup(uint32(0), &v); err != nil {
		return nil, fmt.Errorf("read urnbd_comp_cpu: %w", err)
	}
	return v, nil
}

// CQs returns the completions per CQ and CPU, by user handle and CPU.
func (c *CompletionCPU) CQs() ([]CQCount, error) {
	var out []CQCount
	var k compCPUCqCpuKey
	var v compCPUCqCpuVal
	it := c.objs.UrnbdCqCpu.Iterate()
	for it.Next(&k, &v) {
		out = append(out, CQCount{UserHandle: k.UserHandle, CPU: int(k.Cpu), CompVector: v.CompVector, Count: v.Count})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read urnbd_cq_cpu: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UserHandle != out[j].UserHandle {
			return out[i].UserHandle < out[j].UserHandle
		}
		return out[i].CPU < out[j].CPU
	})
	return out, nil
}

// Reset clears the counts.
func (c *CompletionCPU) Reset() error {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	if err := c.objs.UrnbdCompCpu.Put(uint32(0), make([]uint64, ncpu)); err != nil {
		return fmt.Errorf("reset urnbd_comp_cpu: %w", err)
	}
	return clearMap(c.objs.UrnbdCqCpu)
}

// Close detaches the program and, unless KeepPins was set, removes the
// pins.
func (c *CompletionCPU) Close() error {
	var errs []error
	if c.link != nil {
		errs = append(errs, c.link.Close())
		c.link = nil
	}
	if c.opts.PinDir != "" && !c.opts.KeepPins {
		errs = append(errs, unpin(c.opts.PinDir, c.objs.UrnbdCompCpu, c.objs.UrnbdCqCpu))
	}
	errs = append(errs, c.objs.Close())
	return errors.Join(errs...)
}
