#!/usr/bin/env bash
# Runs in the lab VM: block devices over TCP on the lab's first veth pair
# (192.0.2.1 -> 192.0.2.2), same VM, same run, each on its own null_blk
# device of one kind: fio 4k randread and randwrite at QD32 and 128k
# sequential read at QD32 through
#   urnbd client -> urnbd server, transport=tcp       (nullb0)
#   the kernel's NVMe/TCP: nvme-tcp -> nvmet-tcp      (nullb1)
#   the kernel's NBD: nbd-client -> Debian's nbd-server (nullb2), with as
#   many connections as CPUs (-C), as NVMe/TCP and urnbd have queues
# The runs alternate between them workload by workload, for
# URNBD_BENCH_ROUNDS rounds (default 1); each figure is its best round.
# URNBD_BENCH_SERVER_ARGS adds flags to the urnbd server's (e.g.
# "--backend-io uring"), URNBD_BENCH_MAP_ARGS to the urnbd map (e.g.
# "--zero-copy").
# Writes $LAB_OUT/tcp-bench.txt (every run in tcp-bench-runs.txt, the costs
# per I/O of the urnbd daemons in tcp-bench-costs.txt).
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=lab-lib.sh
. "$here/lab-lib.sh"
costs=${LAB_OUT:-/tmp}/tcp-bench-costs.txt
command -v nbd-server >/dev/null && command -v nbd-client >/dev/null ||
  { echo "tcp-lab: needs nbd-server and nbd-client (tools/deps.sh installs them)" >&2; exit 1; }
null_blk_devices 3
"$prov" rdma >/dev/null

# A socket that connects to 192.0.2.2 without binding (nbd-client) would
# take 192.0.2.2 as its source too and go over lo; this rule gives it the
# route of path 1, whose source is 192.0.2.1, so it crosses the veth as
# the others do (nvme-tcp binds with host_traddr, urnbd with its path).
ip -4 rule add pref 9 iif lo to 192.0.2.2 lookup 100

srv= nbdsrv=
cleanup() {
  [[ -z ${DEV[urnbd-tcp]:-} ]] || "$URNBD_BIN" unmap "${DEV[urnbd-tcp]}" >/dev/null 2>&1 || true
  [[ -z ${DEV[nbd]:-} ]] || nbd-client -d "${DEV[nbd]}" >/dev/null 2>&1 || true
  [[ ! -d $NVMET/subsystems/$NQN ]] || nvme_teardown || true
  [[ -z $srv ]] || kill "$srv" 2>/dev/null || true
  [[ -z $nbdsrv ]] || kill "$nbdsrv" 2>/dev/null || true
  [[ -z ${keep:-} ]] || kill -INT "$keep" 2>/dev/null || true
  ip -4 rule del pref 9 2>/dev/null || true
}
trap cleanup EXIT

# shellcheck disable=SC2086 # the flags are words
"$URNBD_BIN" server --listen tcp://192.0.2.2:1237 --dev-search-path /dev ${URNBD_BENCH_SERVER_ARGS:-} 2>/dev/null &
srv=$!
conf=${LAB_OUT:-/tmp}/nbd-server.conf
printf '[generic]\nuser = root\ngroup = root\nlistenaddr = 192.0.2.2\n[bench]\nexportname = /dev/nullb2\n' >"$conf"
# Not -d: in the foreground nbd-server serves one connection at a time.
nbd-server -C "$conf" -p /run/nbd-server-bench.pid 2>"${LAB_OUT:-/tmp}/nbd-server.log"
nbdsrv=$(cat /run/nbd-server-bench.pid)
sleep 1
counting_check

# shellcheck disable=SC2086 # the flags are words
DEV[urnbd-tcp]=$("$URNBD_BIN" map ${URNBD_BENCH_MAP_ARGS:-} sessname=tcpbench transport=tcp dest_port=1237 path=ip:192.0.2.1@ip:192.0.2.2 device_path=nullb0)
nvme_setup tcp /dev/nullb1
DEV[nvme-tcp]=$nvme_dev
nbd-client 192.0.2.2 /dev/nbd0 -N bench -C "$(nproc)" >&2 || { echo "tcp-lab: nbd-client failed (log: $(tail -3 "${LAB_OUT:-/tmp}/nbd-server.log"))" >&2; exit 1; }
DEV[nbd]=/dev/nbd0
names=(urnbd-tcp nvme-tcp nbd)
for n in "${names[@]}"; do echo "tcp-lab: $n on ${DEV[$n]}" >&2; done

rounds_run "${LAB_OUT:-/tmp}/tcp-bench-runs.txt" "${names[@]}"

out=${LAB_OUT:-/tmp}/tcp-bench.txt
{
  table "block devices over TCP (veth, one path), null_blk backend" "${names[@]}"
  for n in nvme-tcp nbd; do
    printf 'ratio urnbd-tcp / %s: %s\n' "$n" "$(ratios urnbd-tcp "$n")"
  done
  costs_table
} | tee "$out"
