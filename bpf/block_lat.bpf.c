// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * block_lat.bpf.c: block request latency, from issue to completion, per
 * device and direction, in log2 buckets of microseconds and milliseconds.
 *
 * Attached as BTF-enabled tracepoints (tp_btf) to block_rq_issue and
 * block_rq_complete, which are stable across the kernels urnbd supports
 * (6.12 in the lab, newer on hosts). Loaded by LoadBlockLatency.
 */
#include "urnbd_types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "block_lat.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* REQ_OP_BITS and the operations of include/linux/blk_types.h. */
#define REQ_OP_MASK ((1u << 8) - 1)
#define REQ_OP_READ 0
#define REQ_OP_WRITE 1

/* Kernel dev_t: MKDEV of include/linux/kdev_t.h. */
#define MINORBITS 20

/* Request issued and not yet completed, by struct request pointer. A plain
 * preallocated hash: an LRU one costs more per request; should completions
 * go unseen and fill it, new requests are just not timed. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BLK_INFLIGHT_MAX);
	__type(key, __u64);
	__type(value, struct blk_start);
} urnbd_blk_infl SEC(".maps");

/* Microsecond histogram: bucket k counts latencies below 2^k µs (k = 0:
 * below 1 µs), the last bucket everything above. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, BLK_HIST_MAX);
	__type(key, struct blk_hist_key);
	__type(value, __u64);
} urnbd_blk_us SEC(".maps");

/* Millisecond histogram in the rows of RTRS's rdma_lat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, BLK_HIST_MAX);
	__type(key, struct blk_hist_key);
	__type(value, __u64);
} urnbd_blk_ms SEC(".maps");

/* Count, sum and maximum per device and direction. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, BLK_DEVS_MAX * BLK_DIRS);
	__type(key, struct blk_sum_key);
	__type(value, struct blk_sum);
} urnbd_blk_sum SEC(".maps");

/* Devices to trace (kernel dev_t), used when urnbd_blk_cfg says so. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BLK_DEVS_MAX);
	__type(key, __u32);
	__type(value, __u8);
} urnbd_blk_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct blk_cfg);
} urnbd_blk_cfg SEC(".maps");

/* log2 returns floor(log2(v)) for v > 0, without loops. */
static __always_inline __u32 log2_u32(__u32 v)
{
	__u32 r, shift;

	r = (v > 0xFFFF) << 4;
	v >>= r;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

/* bit_len is Go's bits.Len64: 0 for 0, else floor(log2(v)) + 1. */
static __always_inline __u32 bit_len(__u64 v)
{
	__u32 hi = v >> 32;

	if (v == 0)
		return 0;
	if (hi)
		return log2_u32(hi) + 33;
	return log2_u32((__u32)v) + 1;
}

/* hist_add counts one in a per-CPU bucket. A bucket's first count creates
 * it with zeros and then counts in it: creating it with one would lose that
 * count when another CPU creates the same bucket at the same moment (the
 * loser's BPF_NOEXIST update fails). */
static __always_inline void hist_add(void *map, struct blk_hist_key *key)
{
	__u64 zero = 0, *cnt;

	cnt = bpf_map_lookup_elem(map, key);
	if (!cnt) {
		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		cnt = bpf_map_lookup_elem(map, key);
		if (!cnt)
			return;
	}
	(*cnt)++; /* per-CPU value: no atomic needed */
}

/* The tp_btf arguments are BTF-typed pointers: direct loads, checked by
 * the verifier and relocated by CO-RE, are cheaper than probe reads. */
static __always_inline __u32 rq_dev(struct request *rq)
{
	struct gendisk *disk = rq->q->disk;

	if (!disk)
		return 0;
	return ((__u32)disk->major << MINORBITS) | (__u32)disk->first_minor;
}

static __always_inline __u32 rq_dir(struct request *rq)
{
	switch (rq->cmd_flags & REQ_OP_MASK) {
	case REQ_OP_READ:
		return BLK_DIR_READ;
	case REQ_OP_WRITE:
		return BLK_DIR_WRITE;
	default:
		return BLK_DIR_OTHER;
	}
}

static __always_inline bool dev_traced(__u32 dev)
{
	__u32 zero = 0;
	struct blk_cfg *cfg = bpf_map_lookup_elem(&urnbd_blk_cfg, &zero);

	if (!cfg || !cfg->filter)
		return true;
	return bpf_map_lookup_elem(&urnbd_blk_devs, &dev) != NULL;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(urnbd_rq_issue, struct request *rq)
{
	struct blk_start start = {};
	__u64 key = (__u64)rq;

	start.dev = rq_dev(rq);
	if (!dev_traced(start.dev))
		return 0;
	start.dir = rq_dir(rq);
	start.ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&urnbd_blk_infl, &key, &start, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(urnbd_rq_done, struct request *rq, int error, unsigned int nr_bytes)
{
	struct blk_hist_key hkey = {};
	struct blk_sum_key skey = {};
	struct blk_start *start;
	struct blk_sum *sum, zero_sum = {};
	__u64 key = (__u64)rq, ns;

	start = bpf_map_lookup_elem(&urnbd_blk_infl, &key);
	if (!start)
		return 0;
	ns = bpf_ktime_get_ns() - start->ts;
	hkey.dev = skey.dev = start->dev;
	hkey.dir = skey.dir = start->dir;
	bpf_map_delete_elem(&urnbd_blk_infl, &key);
	/* Issue and completion can run on different CPUs, whose clocks may
	 * disagree by a little in a VM: a request that completed "before" it
	 * was issued still completed, and is counted as taking no time. */
	if ((__s64)ns < 0)
		ns = 0;

	hkey.bucket = bit_len(ns / 1000);
	if (hkey.bucket > BLK_US_BUCKETS - 1)
		hkey.bucket = BLK_US_BUCKETS - 1;
	hist_add(&urnbd_blk_us, &hkey);

	hkey.bucket = bit_len(ns / 1000000);
	if (hkey.bucket > BLK_MS_BUCKETS - 1)
		hkey.bucket = BLK_MS_BUCKETS - 1;
	hist_add(&urnbd_blk_ms, &hkey);

	sum = bpf_map_lookup_elem(&urnbd_blk_sum, &skey);
	if (!sum) {
		bpf_map_update_elem(&urnbd_blk_sum, &skey, &zero_sum, BPF_NOEXIST);
		sum = bpf_map_lookup_elem(&urnbd_blk_sum, &skey);
		if (!sum)
			return 0;
	}
	sum->count++;
	sum->sum_ns += ns;
	if (ns > sum->max_ns)
		sum->max_ns = ns;
	return 0;
}
