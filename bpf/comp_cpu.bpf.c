// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * comp_cpu.bpf.c: on which CPU do the completions of user-space CQs land.
 *
 * kprobe on ib_uverbs_comp_handler (module ib_uverbs), which the RDMA core
 * calls for a CQ that has a completion channel once the device signals a
 * completion: from the completion vector's hard IRQ with a real HCA, from
 * the completer's softirq or work item with rxe. It is where a completion
 * becomes the event that wakes the queue thread polling that channel.
 *
 * A kprobe, not fentry: a BPF trampoline's release waits for an RCU-tasks
 * grace period (ftrace_shutdown of its dynamic ftrace_ops), and in the lab
 * that wait never ended in a client daemon killed with RDMA I/O in flight,
 * which then could not exit (nor its ublk devices be recovered). A kprobe
 * uses the kernel's static kprobe ftrace_ops, whose release does not wait
 * for RCU tasks. The kprobe reads its argument from the registers, so the
 * object is built per architecture (amd64, arm64).
 *
 * Counts per CPU, and per CQ (identified by the user_handle libibverbs
 * gave at ibv_create_cq, which is the address of the process's struct
 * ibv_cq) and CPU. Loaded by LoadCompletionCPU, separately from the block
 * programs, because it can only attach where ib_uverbs is loaded.
 */
#include "urnbd_types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "comp_cpu.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Completions per CPU (all CQs). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} urnbd_comp_cpu SEC(".maps");

/* Completions per CQ and CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CQ_CPU_MAX);
	__type(key, struct cq_cpu_key);
	__type(value, struct cq_cpu_val);
} urnbd_cq_cpu SEC(".maps");

SEC("kprobe/ib_uverbs_comp_handler")
int BPF_KPROBE(urnbd_cq_comp, struct ib_cq *cq)
{
	struct cq_cpu_key key = {};
	struct cq_cpu_val *val, init = {};
	__u32 zero = 0;
	__u64 *cnt;

	cnt = bpf_map_lookup_elem(&urnbd_comp_cpu, &zero);
	if (cnt)
		(*cnt)++;

	key.cpu = bpf_get_smp_processor_id();
	key.user_handle = BPF_CORE_READ(cq, uobject, uevent.uobject.user_handle);
	val = bpf_map_lookup_elem(&urnbd_cq_cpu, &key);
	if (val) {
		__sync_fetch_and_add(&val->count, 1);
		return 0;
	}
	init.count = 1;
	init.comp_vector = BPF_CORE_READ(cq, comp_vector);
	if (bpf_map_update_elem(&urnbd_cq_cpu, &key, &init, BPF_NOEXIST)) {
		val = bpf_map_lookup_elem(&urnbd_cq_cpu, &key);
		if (val)
			__sync_fetch_and_add(&val->count, 1);
	}
	return 0;
}
