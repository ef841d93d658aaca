/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * block_lat.h: map layouts of block_lat.bpf.c. The Go types of the same
 * names (blockLat*) are generated from the object's BTF by bpf2go.
 */
#ifndef URNBD_BLOCK_LAT_H
#define URNBD_BLOCK_LAT_H

#define BLK_INFLIGHT_MAX 16384
#define BLK_DEVS_MAX 256
#define BLK_HIST_MAX 8192

/* Bucket counts: those of rtrs.LatUsBuckets and rtrs.RdmaLatBuckets. */
#define BLK_US_BUCKETS 28
#define BLK_MS_BUCKETS 18

enum blk_dir {
	BLK_DIR_READ = 0,
	BLK_DIR_WRITE = 1,
	BLK_DIR_OTHER = 2, /* flush, discard, write zeroes, driver-private */
	BLK_DIRS = 3,
};

/* An issued request: when, on which device, which direction. */
struct blk_start {
	__u64 ts;
	__u32 dev;
	__u32 dir;
};

/* A histogram bucket of one device and direction. */
struct blk_hist_key {
	__u32 dev; /* kernel dev_t of the whole disk: major << 20 | minor */
	__u32 dir; /* enum blk_dir */
	__u32 bucket;
};

struct blk_sum_key {
	__u32 dev;
	__u32 dir;
};

struct blk_sum {
	__u64 count;
	__u64 sum_ns;
	__u64 max_ns;
};

struct blk_cfg {
	__u32 filter; /* 0: every device; 1: only those in urnbd_blk_devs */
};

#endif /* URNBD_BLOCK_LAT_H */
