# tools/bench/lab-lib.sh: what the lab benchmarks share (sourced by
# rnbd-lab.sh and tcp-lab.sh, in the lab VM): their settings, null_blk
# devices, the kernel NVMe-oF target and host on the lab's first veth pair,
# fio runs with their costs per I/O (the whole VM's CPU, and each urnbd
# daemon's CPU, context switches and system calls, counted by perf), the
# interleaved rounds and the table. The caller sets costs (where the costs
# go), srv (the urnbd server's pid) and DEV, and calls counting_check.
: "${URNBD_BIN:?URNBD_BIN must name the urnbd binary}"
prov=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../lab" && pwd -P)/provision.sh
runtime=${URNBD_BENCH_RUNTIME:-5}
rounds=${URNBD_BENCH_ROUNDS:-1}
export URNBD_RUN_DIR=/run/urnbd-bench
declare -A DEV # configuration -> its block device
declare -A R   # configuration,workload -> its best IOPS
# DAEMON: configuration -> the pid whose costs are counted as its daemon's
# (instead of the urnbd client's and server's); fio_engine: fio's engine.
declare -A DAEMON
fio_engine=${fio_engine:-libaio}

# null_blk_devices N: /dev/nullb0..N-1, all of one kind (no data kept).
null_blk_devices() {
  LAB_ARGS_NULL_BLK="nr_devices=$1 gb=4" "$prov" modules >/dev/null
  [[ -b /dev/nullb$(($1 - 1)) ]] ||
    { echo "lab-bench: null_blk was loaded before with fewer devices; need /dev/nullb0..$(($1 - 1))" >&2; exit 1; }
}

# NVMe-oF target and host (kernel): nvmet + nvmet-TRTYPE, nvme-TRTYPE.
NVMET=/sys/kernel/config/nvmet
NQN=nqn.2026-11.io.urnbd:rnbd-lab-bench
NVME_PORT=$NVMET/ports/4420
nvme_dev= # /dev/nvmeXnY of our connection, once connected

nvme_err() { echo "lab-bench: nvme: $*" >&2; return 1; }
# nvme_setup TRTYPE DEV: target subsystem NQN, namespace 1 on DEV, a
# TRTYPE (rdma or tcp) port 192.0.2.2:4420; then connect the host from
# 192.0.2.1 and set nvme_dev.
# Not in a subshell: errexit would not apply there.
nvme_setup() {
  local tr=$1 hostnqn hostid c d i ctrl=""
  modprobe -a nvmet "nvmet-$tr" "nvme-$tr" || { echo "lab-bench: modprobe nvmet nvmet-$tr nvme-$tr failed" >&2; return 1; }
  [[ -d $NVMET ]] || { echo "lab-bench: no $NVMET (configfs not mounted?)" >&2; return 1; }
  mkdir "$NVMET/subsystems/$NQN"
  echo 1 >"$NVMET/subsystems/$NQN/attr_allow_any_host"
  mkdir "$NVMET/subsystems/$NQN/namespaces/1"
  echo -n "$2" >"$NVMET/subsystems/$NQN/namespaces/1/device_path"
  echo 1 >"$NVMET/subsystems/$NQN/namespaces/1/enable"
  mkdir "$NVME_PORT"
  echo "$tr" >"$NVME_PORT/addr_trtype"
  echo ipv4 >"$NVME_PORT/addr_adrfam"
  echo 192.0.2.2 >"$NVME_PORT/addr_traddr"
  echo 4420 >"$NVME_PORT/addr_trsvcid"
  ln -s "$NVMET/subsystems/$NQN" "$NVME_PORT/subsystems/$NQN"
  # A host NQN and ID of our own (the kernel refuses a known host ID with another NQN).
  hostid=$(</proc/sys/kernel/random/uuid)
  hostnqn=nqn.2014-08.org.nvmexpress:uuid:$hostid
  if command -v nvme >/dev/null; then
    nvme connect -t "$tr" -a 192.0.2.2 -s 4420 -w 192.0.2.1 -n "$NQN" -q "$hostnqn" -I "$hostid" >&2
  else
    # What nvme-cli writes; reading back gives instance=N,cntlid=M.
    local fd
    exec {fd}<>/dev/nvme-fabrics
    echo "transport=$tr,traddr=192.0.2.2,trsvcid=4420,host_traddr=192.0.2.1,nqn=$NQN,hostnqn=$hostnqn,hostid=$hostid" >&"$fd" ||
      { exec {fd}>&-; nvme_err "connect through /dev/nvme-fabrics failed (see dmesg)"; }
    read -r -u "$fd" c || true
    exec {fd}>&-
    echo "lab-bench: nvme-fabrics: $c (nvme-cli not installed)" >&2
  fi
  for c in /sys/class/nvme/nvme*; do
    [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$NQN" ]] && ctrl=${c##*/}
  done
  [[ -n $ctrl ]] || nvme_err "connect to $NQN made no controller"
  echo "lab-bench: nvme: $ctrl, transport $(cat "/sys/class/nvme/$ctrl/transport"), $(cat "/sys/class/nvme/$ctrl/address")" >&2
  for ((i = 0; i < 100; i++)); do
    for d in /sys/block/nvme*n*; do
      # With native multipath the per-path disks (nvmeXcYnZ) are hidden: no /dev node.
      if [[ -b /dev/${d##*/} && $(cat "$d/device/subsysnqn" 2>/dev/null) == "$NQN" ]]; then
        nvme_dev=/dev/${d##*/}
        return
      fi
    done
    sleep 0.1
  done
  nvme_err "$ctrl connected but no namespace block device appeared"
}

# nvme_teardown: disconnect and remove the configfs entries (whatever exists).
nvme_teardown() {
  local c
  for c in /sys/class/nvme/nvme*; do
    [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$NQN" ]] && echo 1 >"$c/delete_controller"
  done
  nvme_dev=
  [[ -L $NVME_PORT/subsystems/$NQN ]] && rm "$NVME_PORT/subsystems/$NQN"
  [[ -d $NVME_PORT ]] && rmdir "$NVME_PORT"
  if [[ -d $NVMET/subsystems/$NQN ]]; then
    [[ -d $NVMET/subsystems/$NQN/namespaces/1 ]] && { echo 0 >"$NVMET/subsystems/$NQN/namespaces/1/enable"; rmdir "$NVMET/subsystems/$NQN/namespaces/1"; }
    rmdir "$NVMET/subsystems/$NQN"
  fi
  return 0
}


# vm_busy_us: the CPU time the VM has spent busy so far, in µs.
vm_busy_us() {
  local cpu user nice sys idle iow irq sirq steal rest
  read -r cpu user nice sys idle iow irq sirq steal rest </proc/stat
  echo $(((user + nice + sys + irq + sirq + steal) * 1000000 / $(getconf CLK_TCK)))
}
# ublk_pid ID: the pid serving ublk device ID.
ublk_pid() {
  "$URNBD_BIN" ublk list --format json |
    python3 -c 'import json,sys; print(next(d["pid"] for d in json.load(sys.stdin) if d["id"] == int(sys.argv[1])))' "$1"
}
# dev_ios DEV: the I/Os the block device has completed so far.
dev_ios() { local s; read -r -a s <"/sys/block/${1#/dev/}/stat"; echo $((s[0] + s[4])); }
perf_stop() { kill -INT "$1" 2>/dev/null; wait "$1" 2>/dev/null || true; }
# The system calls counted by name (see the top).
by_name=(io_uring_enter read write futex nanosleep epoll_pwait pread64 pwrite64 sched_yield)
events=task-clock,context-switches,raw_syscalls:sys_enter$(printf ',syscalls:sys_enter_%s' "${by_name[@]}")
# counting_check: whether perf can count the costs per I/O (sets
# can_count). measured counts only while rounds_run sets counting.
counting_check() {
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
  can_count=1
  command -v perf >/dev/null || { can_count=; echo "lab-bench: no perf: costs per I/O not counted" >&2; }
  counting= keep=
}

# keeper_start: perf on init for the rest of the run (sets keep). The same
# events on init keep their static keys enabled: each run's perf then only
# counts, and never makes the kernel patch its text again (jump labels in
# __schedule and the syscall tracepoints), which under TCG once ended in an
# int3 oops mid-patch.
keeper_start() {
  perf stat -e "$events" -p 1 -o /dev/null >/dev/null 2>&1 &
  keep=$!
  # Let it finish patching before any other perf starts: two patching at
  # once is how the oops came (again in a run with the keeper started just
  # before).
  sleep 3
}

fio_iops() { # DEV RW BS
  fio --output-format=json --name=b --filename="$1" --ioengine="$fio_engine" --direct=1 --rw="$2" --bs="$3" \
      --iodepth=32 --time_based --runtime="$runtime" --ramp_time=1 2>/dev/null |
    sed -n '/^{/,$p' | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}

# $costs: per run, NAME RW BS IOPS ios vm_us/io, per daemon us/io cs/io sys/io.
# measured NAME DEV RW BS: fio_iops, with the run's costs appended to $costs.
measured() {
  local name=$1 dev=$2 rw=$3 bs=$4 v i0 i1 c0 c1 pid ios cpid
  local -A pf
  [[ -n $counting ]] || { fio_iops "$dev" "$rw" "$bs"; return; }
  cpid=$(cat "$URNBD_RUN_DIR/client.pid" 2>/dev/null || true)
  for d in client server daemon; do
    case $d in
      client) pid=$cpid ;;
      server) pid=${srv:-} ;;
      daemon) pid=${DAEMON[$name]:-} ;;
    esac
    [[ $d == daemon || -z ${DAEMON[$name]:-} ]] || continue
    [[ -n $pid ]] || continue
    # The process's CPU, switches and system calls, until perf_stop.
    perf stat -x, -e "$events" -p "$pid" -o "$LAB_OUT/perf-$d.txt" >/dev/null 2>&1 &
    pf[$d]=$!
  done
  sleep 0.5 # perf attached
  i0=$(dev_ios "$dev"); c0=$(vm_busy_us); t0=$(date +%s.%N)
  v=$(fio_iops "$dev" "$rw" "$bs") || v=failed
  i1=$(dev_ios "$dev"); c1=$(vm_busy_us); t1=$(date +%s.%N)
  for d in "${!pf[@]}"; do perf_stop "${pf[$d]}"; done
  ios=$((i1 - i0))
  {
    printf '%s %s %s %s ios=%d vm_us/io=%s' "$name" "$rw" "$bs" "$v" "$ios" "$(python3 -c "print(f'{$((c1 - c0)) / max($ios, 1):.1f}')")"
    for d in client server daemon; do
      [[ -n ${pf[$d]:-} ]] || continue
      python3 - "$d" "$ios" "$LAB_OUT/perf-$d.txt" "$t0" "$t1" "${by_name[@]}" <<'PY'
import sys
d, ios, path, names = sys.argv[1], max(int(sys.argv[2]), 1), sys.argv[3], sys.argv[6:]
secs = max(float(sys.argv[5]) - float(sys.argv[4]), 1e-3)
counts = {}
for line in open(path):
    f = line.strip().split(",")
    if len(f) > 2:
        try: counts[f[2].removesuffix(":u")] = float(f[0])
        except ValueError: pass
def per(event, k=1):
    x = counts.get(event)
    return "n/a" if x is None else f"{x * k / ios:.2f}"
calls = ",".join(f"{n}={per('syscalls:sys_enter_' + n)}" for n in names
                 if counts.get("syscalls:sys_enter_" + n))
# Calls per second beside calls per I/O: the Go runtime's fixed costs
# (sysmon, scheduler hand-offs) show as a rate that does not follow IOPS.
rate = counts.get("raw_syscalls:sys_enter")
rate = "n/a" if rate is None else f"{rate / secs:.0f}"
print(f" {d}:us/io={per('task-clock', 1000)},cs/io={per('context-switches')},"
      f"sys/io={per('raw_syscalls:sys_enter')}[{calls}],sys/s={rate}", end="")
PY
    done
    echo
  } >>"$costs"
  echo "$v"
}

# best NAME,W IOPS: keep the best round (other VMs on the host only slow us down).
# A failed fio run (e.g. a session the starved VM let time out) only loses that run.
best() { [[ $2 =~ ^[0-9]+$ ]] || { echo "lab-bench: warning: fio gave no IOPS for $1" >&2; return 0; }; ((${R[$1]:-0} >= $2)) || R[$1]=$2; }

# ratios A B: A's best IOPS over B's, for rr, rw and sr ("n/a" where missing).
ratios() {
  python3 -c 'import sys; a = sys.argv[1:4]; b = sys.argv[4:]
print(" ".join(f"{int(x) / int(y):.2f}" if x.isdigit() and y.isdigit() else "n/a" for x, y in zip(a, b)))' \
    "${R[$1,rr]:-}" "${R[$1,rw]:-}" "${R[$1,sr]:-}" "${R[$2,rr]:-}" "${R[$2,rw]:-}" "${R[$2,sr]:-}"
}

# rounds_run RUNS NAME...: fio 4k randread, 4k randwrite and 128k read on
# each configuration's DEV, workload by workload, for $rounds rounds, every
# other round in reverse order (a disturbance from outside hits all alike);
# every run goes to RUNS, the best of each into R. The rounds run with no
# perf attached: counted syscall tracepoints cost a daemon per system call
# and a kernel peer almost nothing (urnbd lost 25 % of its 4k IOPS to them
# in one run, NVMe/TCP 0-6 %), so IOPS measured under them would bias the
# ratios. The costs per I/O come from one more, counted round, whose IOPS
# go to RUNS marked "counted" and not into R.
rounds_run() {
  local runs=$1 round i order
  shift
  : >"$runs"
  : >"$costs"
  counting=
  for ((round = 1; round <= rounds; round++)); do
    order=("$@")
    if ((round % 2 == 0)); then
      order=()
      for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
    fi
    one_round "$runs" "$round" "${order[@]}"
  done
  [[ -n $can_count ]] || return 0
  counting=1
  keeper_start
  one_round "$runs" counted "$@"
}

# one_round RUNS ROUND NAME...: each workload on each configuration in
# turn, every run to RUNS as round ROUND; the best into R unless ROUND is
# "counted".
one_round() {
  local runs=$1 round=$2 k rw bs w n v
  shift 2
  for w in "rr randread 4k" "rw randwrite 4k" "sr read 128k"; do
    read -r k rw bs <<<"$w"
    for n in "$@"; do
      v=$(measured "$n" "${DEV[$n]}" "$rw" "$bs") || v=failed
      echo "$round $n $rw $bs $v" >>"$runs"
      [[ $round == counted ]] || best "$n,$k" "$v"
    done
  done
}

# table TITLE NAME...: the best IOPS of each configuration, under TITLE
# and the run's settings.
table() {
  local n
  echo "$1, fio $fio_engine QD32, ${runtime}s, interleaved, best of $rounds round(s); $(uname -r), $(nproc) vCPUs under qemu TCG"
  shift
  printf '%-22s %12s %12s %12s\n' "${table_col:-client -> server}" "4k randread" "4k randwrite" "128k seqread"
  for n in "$@"; do
    printf '%-22s %12s %12s %12s\n' "$n" "${R[$n,rr]:-n/a}" "${R[$n,rw]:-n/a}" "${R[$n,sr]:-n/a}"
  done
}

# costs_table: the costs per I/O of the counted round's runs.
costs_table() {
  [[ -s $costs ]] || return 0
  echo "costs per I/O (a separate round under perf, whose IOPS, slowed by the counting, are not the table's): CPU µs of the whole VM, and per urnbd daemon its CPU µs, context switches and system calls (per I/O, and sys/s per second)"
  awk '{k = $1" "$2" "$3; line[k] = $0} END {for (k in line) print line[k]}' "$costs" | sort
}
