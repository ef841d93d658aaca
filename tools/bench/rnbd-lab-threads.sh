#!/usr/bin/env bash
# Runs in the lab VM: where the urnbd daemons' system calls come from, thread
# by thread. For each binary (and server options) in URNBD_THREADS_BINS,
# alternating for URNBD_BENCH_ROUNDS rounds (default 2), it maps
#   urnbd client -> kernel server  (counts the urnbd client daemon)
#   kernel client -> urnbd server  (counts the urnbd server)
# over soft-RoCE, each on a null_blk device, runs fio 4k randread (or
# URNBD_THREADS_RW) at QD32 and counts, with perf stat --per-thread over
# URNBD_THREADS_SECS seconds (default 6) of it, each thread's CPU time,
# context switches and system calls by name. It prints them per I/O and,
# for the whole daemon, per second as well: the Go runtime's costs (sysmon's
# nanosleep, the futex calls of a scheduler hand-off) follow time, not I/O.
#   URNBD_THREADS_BINS  "NAME=PATH[@OPTION@OPTION...] ...", e.g.
#                       "sync=/x/urnbd@--backend-io@sync loop=/x/urnbd"
#                       (default: "urnbd=$URNBD_BIN"; URNBD_BIN is needed
#                       either way, for lab-lib.sh)
# Writes $LAB_OUT/threads.txt. From the host, for example:
#   go build -o .cache/lab/bin/urnbd ./cmd/urnbd && tools/lab/lab --kernel 7 build-rnbd
#   tools/lab/lab --kernel 7 run --out .cache/bench/threads -- \
#     env URNBD_BIN=$PWD/.cache/lab/bin/urnbd tools/bench/rnbd-lab-threads.sh
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=lab-lib.sh
. "$here/lab-lib.sh"
out=${LAB_OUT:-/tmp}/threads.txt
secs=${URNBD_THREADS_SECS:-6}
null_blk_devices 5
"$prov" rdma >/dev/null
LAB_ARGS_RNBD_SERVER="dev_search_path=/" "$prov" rnbd >/dev/null
CTL=/sys/devices/virtual/rnbd-client/ctl/map_device
names=(io_uring_enter read write ioctl futex nanosleep epoll_pwait ppoll pread64 pwrite64 sched_yield rt_sigreturn)
events=task-clock,context-switches,raw_syscalls:sys_enter$(printf ',syscalls:sys_enter_%s' "${names[@]}")

srv= keep=
cleanup() {
  [[ -z $srv ]] || kill "$srv" 2>/dev/null || true
  [[ -z $keep ]] || kill -INT "$keep" 2>/dev/null || true
}
trap cleanup EXIT
mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
# As keeper_start (lab-lib.sh): the events enabled once for the whole run, so that no
# perf run patches the kernel's text while another counts (an oops under TCG).
perf stat -e "$events" -a -o /dev/null >/dev/null 2>&1 &
keep=$!
sleep 4

kmap() { # SESS PORT DEVPATH -> /dev/rnbdN
  echo "dest_port=$2 sessname=$1 path=ip:192.0.2.1,ip:192.0.2.2 device_path=$3" >"$CTL"
  for _ in $(seq 50); do
    for d in /sys/block/rnbd*; do
      [[ -f $d/rnbd/session && $(cat "$d/rnbd/session") == "$1" ]] && { echo "/dev/${d##*/}"; return; }
    done
    sleep 0.1
  done
  return 1
}

# count NAME PID DEV: fio on DEV, perf per thread of PID; the summary to $out.
count() {
  local name=$1 pid=$2 dev=$3 fp i0 i1 f
  f=$(mktemp)
  fio --name=t --filename="$dev" --ioengine=libaio --direct=1 --rw="${URNBD_THREADS_RW:-randread}" --bs=4k \
      --iodepth=32 --time_based --runtime=$((secs + 4)) >/dev/null 2>&1 &
  fp=$!
  sleep 2
  i0=$(dev_ios "$dev")
  perf stat --per-thread -x, -e "$events" -p "$pid" -o "$f" -- sleep "$secs"
  i1=$(dev_ios "$dev")
  wait "$fp" || echo "rnbd-lab-threads: fio on $dev failed" >&2
  python3 - "$f" $((i1 - i0)) "$secs" "$name" <<'PY' | tee -a "$out"
import collections, sys
path, ios, secs, name = sys.argv[1], max(int(sys.argv[2]), 1), float(sys.argv[3]), sys.argv[4]
total, per = collections.Counter(), collections.defaultdict(collections.Counter)
for line in open(path):
    f = line.strip().split(",")
    if line.startswith("#") or len(f) < 4:
        continue
    try:
        v = float(f[1])
    except ValueError:
        continue
    ev = f[3].replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "sys")
    ev = ev.replace("task-clock", "cpu_ms").replace("context-switches", "cs")
    total[ev] += v
    per[f[0]][ev] += v
def fmt(c, k=1.0):
    return " ".join(f"{e}={v * k:.3f}" for e, v in sorted(c.items()) if v)
print(f"{name}: {ios / secs:.0f} IOPS; per I/O: {fmt(total, 1 / ios)}")
print(f"{name}: per second: {fmt(total, 1 / secs)}")
for t, c in sorted(per.items()):
    if c["sys"] >= ios * 0.02:
        print(f"  {t} per I/O: {fmt(c, 1 / ios)}")
PY
  rm -f "$f"
}

: >"$out"
for ((round = 1; round <= ${URNBD_BENCH_ROUNDS:-2}; round++)); do
  for nb in ${URNBD_THREADS_BINS:-urnbd=$URNBD_BIN}; do
    n=${nb%%=*} bin=${nb#*=} args=
    if [[ $bin == *@* ]]; then args=${bin#*@} args=${args//@/ } bin=${bin%%@*}; fi
    # shellcheck disable=SC2086
    "$bin" server --listen rdma://192.0.2.2:1236 --dev-search-path /dev $args 2>/dev/null &
    srv=$!
    sleep 1
    uk=$("$bin" map sessname=uk transport=rdma dest_port=1234 path=ip:192.0.2.1@ip:192.0.2.2 device_path=/dev/nullb3)
    ku=$(kmap ku 1236 nullb4)
    echo "== round $round: $n ($bin${args:+ server $args})" | tee -a "$out"
    count "$n client" "$(cat "$URNBD_RUN_DIR/client.pid")" "$uk"
    count "$n server" "$srv" "$ku"
    echo normal >"/sys/block/${ku#/dev/}/rnbd/unmap_device"
    "$bin" unmap "$uk" >/dev/null
    kill "$srv"
    wait "$srv" 2>/dev/null || true
    srv=
    pkill -f "^$bin client" || true
    sleep 2
  done
done
