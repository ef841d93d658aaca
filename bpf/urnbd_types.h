/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * urnbd_types.h: the few kernel types urnbd's eBPF programs use, instead of
 * a generated vmlinux.h.
 *
 * Kernel structs are declared with only the fields the programs read and
 * marked preserve_access_index, so every access is a CO-RE relocation that
 * cilium/ebpf resolves at load time against the running kernel's BTF
 * (/sys/kernel/btf/vmlinux and the modules' BTF). Field order and sizes
 * here do not matter; names and types do.
 */
#ifndef URNBD_TYPES_H
#define URNBD_TYPES_H

typedef unsigned char __u8;
typedef short int __s16;
typedef short unsigned int __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long int __s64;
typedef long long unsigned int __u64;
typedef __u16 __le16;
typedef __u16 __be16;
typedef __u32 __le32;
typedef __u32 __be32;
typedef __u64 __le64;
typedef __u64 __be64;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

/* From include/uapi/linux/bpf.h. */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

/* include/linux/blkdev.h */
struct gendisk {
	int major;
	int first_minor;
};

struct request_queue {
	struct gendisk *disk;
};

/* include/linux/blk-mq.h; cmd_flags is blk_opf_t (unsigned int). */
struct request {
	struct request_queue *q;
	unsigned int cmd_flags;
};

/* include/rdma/ib_verbs.h */
struct ib_uobject {
	__u64 user_handle;
};

/* drivers/infiniband/core/uverbs.h (ib_uverbs module BTF) */
struct ib_uevent_object {
	struct ib_uobject uobject;
};

struct ib_ucq_object {
	struct ib_uevent_object uevent;
};

/* include/rdma/ib_verbs.h */
struct ib_cq {
	struct ib_ucq_object *uobject;
	unsigned int comp_vector;
};

#pragma clang attribute pop

/*
 * The registers a kprobe program gets, in the layout of the user-space
 * ABI (include/uapi/asm/ptrace.h), which is what bpf_tracing.h's
 * PT_REGS_PARM* read without a vmlinux.h. Not CO-RE relocated: the kernel
 * names the fields differently, and this layout is ABI.
 */
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8;
	unsigned long rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags, rsp, ss;
};
#elif defined(__TARGET_ARCH_arm64)
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};
#endif

#endif /* URNBD_TYPES_H */
