//go:build linux

package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// BlockLatencyOptions configure LoadBlockLatency.
type BlockLatencyOptions struct {
	Options
	// Devices, if not empty, are the only devices traced (user-space
	// dev_t of whole disks; see DiskOf). More can be added with
	// AddDevice. With none, every block device is traced.
	Devices []uint64
}

// BlockLatency traces block request latency, from issue to completion
// (tracepoints block_rq_issue and block_rq_complete), per device and
// direction. Its maps:
//
//	urnbd_blk_us    per-CPU hash {dev, dir, bucket} -> count, µs log2 buckets
//	urnbd_blk_ms    per-CPU hash {dev, dir, bucket} -> count, rdma_lat rows
//	urnbd_blk_sum   per-CPU hash {dev, dir} -> {count, sum_ns, max_ns}
//	urnbd_blk_infl  hash, request address -> {ts, dev, dir}
//	urnbd_blk_devs  hash, dev -> 1: the traced devices
//	urnbd_blk_cfg   array[1] {filter}: 1 when only urnbd_blk_devs are traced
//
// dev is the kernel's dev_t of the disk (major << 20 | minor); dir is 0
// for reads, 1 for writes and 2 for other operations (flush, discard...).
type BlockLatency struct {
	objs  blockLatObjects
	links []link.Link
	opts  Options
}

// LoadBlockLatency loads the block latency programs and attaches them. It
// needs CAP_BPF and CAP_PERFMON (or root) and a kernel with BTF.
func LoadBlockLatency(opts BlockLatencyOptions) (*BlockLatency, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := loadBlockLat()
	if err != nil {
		return nil, err
	}
	copts, err := opts.collectionOptions(spec)
	if err != nil {
		return nil, err
	}
	b := &BlockLatency{opts: opts.Options}
	if err := spec.LoadAndAssign(&b.objs, copts); err != nil {
		return nil, fmt.Errorf("load block latency programs: %w", err)
	}
	// Maps reused from pins keep their previous filter: start afresh.
	if err := b.setFilter(false); err != nil {
		b.Close()
		return nil, err
	}
	if err := clearMap(b.objs.UrnbdBlkDevs); err != nil {
		b.Close()
		return nil, err
	}
	for _, dev := range opts.Devices {
		if err := b.AddDevice(dev); err != nil {
			b.Close()
			return nil, err
		}
	}
	for _, p := range []*ebpf.Program{b.objs.UrnbdRqIssue, b.objs.UrnbdRqDone} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("attach %s: %w", p, err)
		}
		b.links = append(b.links, l)
	}
	return b, nil
}

// AddDevice adds dev (a user-space dev_t of a whole disk) to the traced
// devices; from then on, only the added devices are traced.
func (b *BlockLatency) AddDevice(dev uint64) error {
	if err := b.objs.UrnbdBlkDevs.Put(kernelDev(dev), uint8(1)); err != nil {
		return fmt.Errorf("trace device %s: %w", DevName(dev), err)
	}
	return b.setFilter(true)
}

// RemoveDevice stops tracing dev. Requests already issued to it are still
// counted when they complete. When no device is left, none is traced.
func (b *BlockLatency) RemoveDevice(dev uint64) error {
	err := b.objs.UrnbdBlkDevs.Delete(kernelDev(dev))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("untrace device %s: %w", DevName(dev), err)
	}
	return nil
}

func (b *BlockLatency) setFilter(on bool) error {
	cfg := blockLatBlkCfg{}
	if on {
		cfg.Filter = 1
	}
	if err := b.objs.UrnbdBlkCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("set device filter: %w", err)
	}
	return nil
}

// Devices returns the devices that have completed requests in the
// histograms, as user-space dev_t values.
func (b *BlockLatency) Devices() ([]uint64, error) {
	seen := map[uint32]bool{}
	var devs []uint64
	var k blockLatBlkSumKey
	var v []blockLatBlkSum
	it := b.objs.UrnbdBlkSum.Iterate()
	for it.Next(&k, &v) {
		if !seen[k.Dev] {
			seen[k.Dev] = true
			devs = append(devs, userDev(k.Dev))
		}
	}
	return devs, it.Err()
}

// Histogram returns the latency distribution of dev (a user-space dev_t)
// since loading or the last Reset, summed over CPUs.
func (b *BlockLatency) Histogram(dev uint64) (*Histogram, error) {
	kdev := kernelDev(dev)
	h := &Histogram{}
	var hk blockLatBlkHistKey
	var counts []uint64
	it := b.objs.UrnbdBlkUs.Iterate()
	for it.Next(&hk, &counts) {
		if hk.Dev == kdev && hk.Dir < NumDirs && hk.Bucket < LatUsBuckets {
			h.Us[hk.Dir][hk.Bucket] += sum(counts)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read urnbd_blk_us: %w", err)
	}
	it = b.objs.UrnbdBlkMs.Iterate()
	for it.Next(&hk, &counts) {
		if hk.Dev == kdev && hk.Dir < NumDirs && hk.Bucket < RdmaLatBuckets {
			h.Ms[hk.Dir][hk.Bucket] += sum(counts)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read urnbd_blk_ms: %w", err)
	}
	for dir := range Dir(NumDirs) {
		var sums []blockLatBlkSum
		err := b.objs.UrnbdBlkSum.Lookup(blockLatBlkSumKey{Dev: kdev, Dir: uint32(dir)}, &sums)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read urnbd_blk_sum: %w", err)
		}
		for _, s := range sums {
			h.Count[dir] += s.Count
			h.SumNs[dir] += s.SumNs
			h.MaxNs[dir] = max(h.MaxNs[dir], s.MaxNs)
		}
	}
	return h, nil
}

// Missed returns how many runs of the issue and completion programs the
// kernel skipped since loading, because another run of the same program
// was already under way on that CPU (a completion in an interrupt on top
// of one in a softirq, say). Each skip loses one request from the
// histograms, so a caller comparing counts with I/O it did must allow for
// it. The figure covers all devices and is not cleared by Reset.
func (b *BlockLatency) Missed() (uint64, error) {
	var n uint64
	for _, p := range []*ebpf.Program{b.objs.UrnbdRqIssue, b.objs.UrnbdRqDone} {
		st, err := p.Stats()
		if err != nil {
			return 0, fmt.Errorf("read stats of %s: %w", p, err)
		}
		n += st.RecursionMisses
	}
	return n, nil
}

// Reset clears the histograms of all devices.
func (b *BlockLatency) Reset() error {
	return errors.Join(clearMap(b.objs.UrnbdBlkUs), clearMap(b.objs.UrnbdBlkMs), clearMap(b.objs.UrnbdBlkSum))
}

// Close detaches the programs and, unless KeepPins was set, removes the
// pins.
func (b *BlockLatency) Close() error {
	var errs []error
	for _, l := range b.links {
		errs = append(errs, l.Close())
	}
	b.links = nil
	if b.opts.PinDir != "" && !b.opts.KeepPins {
		m := &b.objs.blockLatMaps
		errs = append(errs, unpin(b.opts.PinDir, m.UrnbdBlkUs, m.UrnbdBlkMs, m.UrnbdBlkSum,
			m.UrnbdBlkInfl, m.UrnbdBlkDevs, m.UrnbdBlkCfg))
	}
	errs = append(errs, b.objs.Close())
	return errors.Join(errs...)
}

func sum(v []uint64) uint64 {
	var n uint64
	for _, x := range v {
		n += x
	}
	return n
}

// clearMap deletes every key of a hash map: it lists the keys first, as
// deleting while walking with NextKey can restart the walk.
func clearMap(m *ebpf.Map) error {
	var keys [][]byte
	var key any // nil: the first key
	for {
		next, err := m.NextKeyBytes(key)
		if err != nil {
			return fmt.Errorf("clear %s: %w", m, err)
		}
		if next == nil {
			break
		}
		keys = append(keys, next)
		key = next
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear %s: %w", m, err)
		}
	}
	return nil
}
