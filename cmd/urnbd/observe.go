package main

import (
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/urnbd/urnbd/bpf"
	"github.com/urnbd/urnbd/ublk"
)

// observer holds the client daemon's eBPF programs: block latency of the
// mapped devices and the CPU of RDMA completion handlers. Either may be
// missing (no BTF, no privilege, no ib_uverbs, --no-bpf); the statistics
// from urnbd's own counters do not depend on them, and the reason a
// program is missing is shown where its numbers would be.
type observer struct {
	mu       sync.Mutex
	disabled string // why eBPF is off altogether, or ""
	blk      *bpf.BlockLatency
	blkErr   error
	comp     *bpf.CompletionCPU
	compErr  error
}

func newObserver(disabled string) *observer {
	o := &observer{disabled: disabled}
	if disabled != "" {
		return o
	}
	o.blk, o.blkErr = bpf.LoadBlockLatency(bpf.BlockLatencyOptions{Options: bpf.Options{PinDir: bpf.DefaultPinDir}})
	if o.blkErr != nil {
		log.Printf("urnbd client daemon: block latency tracing is off: %v", o.blkErr)
	}
	return o
}

// completionCPU returns the completion CPU program, loading it on first
// use: ib_uverbs is loaded by the first RDMA session, not before.
func (o *observer) completionCPU() (*bpf.CompletionCPU, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.disabled != "" {
		return nil, errors.New(o.disabled)
	}
	if o.comp == nil && (o.compErr == nil || errors.Is(o.compErr, bpf.ErrUnavailable)) {
		o.comp, o.compErr = bpf.LoadCompletionCPU(bpf.Options{PinDir: bpf.DefaultPinDir})
		if o.compErr != nil && !errors.Is(o.compErr, bpf.ErrUnavailable) {
			log.Printf("urnbd client daemon: completion CPU tracing is off: %v", o.compErr)
		}
	}
	return o.comp, o.compErr
}

// blockLatency returns the block latency program, or why there is none.
func (o *observer) blockLatency() (*bpf.BlockLatency, error) {
	if o.disabled != "" {
		return nil, errors.New(o.disabled)
	}
	return o.blk, o.blkErr
}

// addDevice starts tracing the block requests of ublk device id.
func (o *observer) addDevice(id uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.blk == nil {
		return
	}
	dev, err := bpf.DiskOf(ublk.BlockPath(id))
	if err == nil {
		err = o.blk.AddDevice(dev)
	}
	if err != nil {
		log.Printf("urnbd client daemon: trace %s: %v", ublk.BlockPath(id), err)
	}
}

// removeDevice stops tracing ublk device id (before it goes away: its
// dev_t is read from the node).
func (o *observer) removeDevice(id uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.blk == nil {
		return
	}
	if dev, err := bpf.DiskOf(ublk.BlockPath(id)); err == nil {
		o.blk.RemoveDevice(dev)
	}
}

// reset clears what the programs counted.
func (o *observer) reset() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var errs []error
	if o.blk != nil {
		errs = append(errs, o.blk.Reset())
	}
	if o.comp != nil {
		errs = append(errs, o.comp.Reset())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reset eBPF counters: %w", err)
	}
	return nil
}

func (o *observer) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.blk != nil {
		o.blk.Close()
		o.blk = nil
	}
	if o.comp != nil {
		o.comp.Close()
		o.comp = nil
	}
}
