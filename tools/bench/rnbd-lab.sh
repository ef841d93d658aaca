#!/usr/bin/env bash
# Runs in the lab VM: RNBD over soft-RoCE (path 192.0.2.1 -> 192.0.2.2),
# same VM, same run, all backed by null_blk: fio 4k randread and randwrite
# at QD32 and 128k sequential read at QD32 through
#   kernel client -> kernel server  (the reference)
#   urnbd client  -> urnbd server
#   urnbd client  -> kernel server
#   kernel client -> urnbd server
# and, for comparison, NVMe-oF over the same rxe link: the kernel's nvmet +
# nvmet-rdma target (configfs: a subsystem with allow_any_host, namespace 1
# on a second null_blk device of the same kind, an rdma port on
# 192.0.2.2:4420) and the kernel's nvme-rdma host connecting from 192.0.2.1
# (with nvme-cli when installed, else through /dev/nvme-fabrics).
# All five are mapped at once, each on its own null_blk device (nullb0..4),
# and the fio runs alternate between them workload by workload, for
# URNBD_BENCH_ROUNDS rounds (default 1): a disturbance from outside (other
# VMs on the host) hits all of them alike, and each figure is its best round.
# Each run also counts, over the same window, the I/Os the device completed
# (/sys/block/DEV/stat), the CPU time of the whole VM (/proc/stat), and
# for each urnbd daemon (client, server) its CPU time, context switches and
# system calls (perf stat: task-clock, context-switches,
# raw_syscalls:sys_enter), and those calls by name for the ones a datapath
# makes (io_uring_enter; read and write, which are also the verbs
# provider's calls: rxe's post_send doorbell and req_notify_cq are writes,
# ibv_get_cq_event is a read; futex, nanosleep and epoll_pwait of the Go
# runtime; pread64/pwrite64 of a synchronous backend). Per I/O, they land
# in rnbd-bench-costs.txt.
# Writes $LAB_OUT/rnbd-bench.txt (and every run in rnbd-bench-runs.txt).
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=lab-lib.sh
. "$here/lab-lib.sh"
costs=${LAB_OUT:-/tmp}/rnbd-bench-costs.txt
null_blk_devices 5
"$prov" rdma >/dev/null
LAB_ARGS_RNBD_SERVER="dev_search_path=/" "$prov" rnbd >/dev/null
CTL=/sys/devices/virtual/rnbd-client/ctl/map_device

srv=
cleanup() {
  local n
  for n in "${!DEV[@]}"; do
    case $n in
    kernel-*) kunmap "${DEV[$n]}" 2>/dev/null || true ;;
    urnbd-*) uunmap "${DEV[$n]}" 2>/dev/null || true ;;
    esac
  done
  [[ ! -d $NVMET/subsystems/$NQN ]] || nvme_teardown || true
  [[ -z $srv ]] || kill "$srv" 2>/dev/null || true
  [[ -z ${keep:-} ]] || kill -INT "$keep" 2>/dev/null || true
}
trap cleanup EXIT

# URNBD_SERVER_ARGS: more options for the urnbd server (e.g. --backend-io loop).
# shellcheck disable=SC2086
"$URNBD_BIN" server --listen rdma://192.0.2.2:1236 --dev-search-path /dev ${URNBD_SERVER_ARGS:-} 2>/dev/null &
srv=$!
sleep 1

counting_check

kmap() { # SESS PORT DEVPATH -> /dev/rnbdN
  echo "dest_port=$2 sessname=$1 path=ip:192.0.2.1,ip:192.0.2.2 device_path=$3" >"$CTL"
  for _ in $(seq 50); do
    for d in /sys/block/rnbd*; do
      [ -f "$d/rnbd/session" ] && [ "$(cat "$d/rnbd/session")" = "$1" ] && { echo "/dev/${d##*/}"; return; }
    done
    sleep 0.1
  done
  return 1
}
kunmap() { echo normal >"/sys/block/${1#/dev/}/rnbd/unmap_device"; }
umap() { "$URNBD_BIN" map sessname="$1" transport=rdma dest_port="$2" path=ip:192.0.2.1@ip:192.0.2.2 device_path="$3"; }
uunmap() { "$URNBD_BIN" unmap "$1" >/dev/null; }

DEV[kernel-kernel]=$(kmap kk 1234 /dev/nullb0)
nvme_setup rdma /dev/nullb1; DEV[nvme-rdma]=$nvme_dev
DEV[urnbd-urnbd]=$(umap uu 1236 nullb2)
DEV[urnbd-kernel]=$(umap uk 1234 /dev/nullb3)
DEV[kernel-urnbd]=$(kmap ku 1236 nullb4)
names=(kernel-kernel nvme-rdma urnbd-urnbd urnbd-kernel kernel-urnbd)
for n in "${names[@]}"; do echo "rnbd-lab: $n on ${DEV[$n]}" >&2; done
rounds_run "${LAB_OUT:-/tmp}/rnbd-bench-runs.txt" "${names[@]}"
for n in kernel-kernel kernel-urnbd; do kunmap "${DEV[$n]}" || echo "rnbd-lab: warning: unmap $n failed" >&2; unset "DEV[$n]"; done
for n in urnbd-urnbd urnbd-kernel; do uunmap "${DEV[$n]}" || echo "rnbd-lab: warning: unmap $n failed" >&2; unset "DEV[$n]"; done
unset "DEV[nvme-rdma]"; nvme_teardown

out=${LAB_OUT:-/tmp}/rnbd-bench.txt
{
  table "RNBD (and NVMe-oF: nvme-rdma -> nvmet-rdma) over soft-RoCE (rxe, one path), null_blk backend" "${names[@]}"
  for n in nvme-rdma urnbd-urnbd urnbd-kernel kernel-urnbd; do
    printf 'ratio %s / kernel-kernel: %s\n' "$n" "$(ratios "$n" kernel-kernel)"
  done
  costs_table
} | tee "$out"
