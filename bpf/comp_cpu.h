/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * comp_cpu.h: map layouts of comp_cpu.bpf.c. The Go types of the same
 * names (compCPU*) are generated from the object's BTF by bpf2go.
 */
#ifndef URNBD_COMP_CPU_H
#define URNBD_COMP_CPU_H

#define CQ_CPU_MAX 16384

struct cq_cpu_key {
	__u64 user_handle; /* the process's struct ibv_cq address */
	__u32 cpu;         /* CPU the completion handler ran on */
	__u32 pad;
};

struct cq_cpu_val {
	__u64 count;
	__u32 comp_vector; /* completion vector of the CQ */
	__u32 pad;
};

#endif /* URNBD_COMP_CPU_H */
