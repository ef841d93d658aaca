#!/usr/bin/env bash
# Runs in the lab VM: what each part of a 4k I/O over urnbd's TCP path
# costs, beside the kernel's NVMe/TCP, in one boot. fio 4k randread and
# randwrite QD32 (io_uring, O_DIRECT, no perf attached), for
# URNBD_BENCH_ROUNDS rounds (default 3), on:
#   null_blk    the kernel's null device: fio and the block layer alone
#   ublk-null   urnbd's ublk null target: + the ublk round trip
#   urnbd-tcp   urnbd over TCP on the lab's first veth pair, null_blk behind
#               the server: the whole path
#   urnbd-mem   the same to a memory export of the same server (written once
#               before the rounds, so that no run pays first-touch page
#               faults): the path without the server's backend I/O
#   nvme-tcp    the kernel's NVMe/TCP on the same veth and backend kind
#   rtrsbench   RTRS over TCP alone on the same veth (tools/rtrsbench: client
#               and server in one process, memory backend; no fio, no ublk,
#               no RNBD), if URNBD_RTRSBENCH (default: rtrsbench beside
#               URNBD_BIN) is there; its VM time is the machine's busy time
#               over its measured window, which it reports itself
# Per run: IOPS, the whole VM's busy CPU µs per I/O and busy CPUs, and
# CPU µs per I/O by who spent it (/proc, no perf): fio's own (its
# usr+sys), the ublk server's ("daemon": the client daemon, or ublk-null's),
# the urnbd server's, the VM's time in interrupts and softirqs, the three
# other threads (by kind) that took the most: the kernel's work outside
# those processes (kworkers: NVMe/TCP's io_work, ksoftirqd, ...), and the
# three busiest threads of the daemon and of the server, each as µs per
# I/O / voluntary context switches per I/O (a pinned ublk queue thread
# shows its CPU as @N; the Go runtime's sysmon is the one that switches
# most for its CPU).
# Writes $LAB_OUT/tcp-parts.txt.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
fio_engine=io_uring
# shellcheck source=lab-lib.sh
. "$here/lab-lib.sh"
rounds=${URNBD_BENCH_ROUNDS:-3}
bench=${URNBD_RTRSBENCH:-$(dirname -- "$URNBD_BIN")/rtrsbench}
out=${LAB_OUT:-/tmp}/tcp-parts.txt
null_blk_devices 3
"$prov" rdma >/dev/null
# Local traffic to 192.0.2.2 takes path 1's route (source 192.0.2.1), so
# that it crosses the veth rather than lo, as in tcp-lab.sh.
ip -4 rule add pref 9 iif lo to 192.0.2.2 lookup 100

srv=
cleanup() {
  [[ -z ${DEV[urnbd-tcp]:-} ]] || "$URNBD_BIN" unmap "${DEV[urnbd-tcp]}" >/dev/null 2>&1 || true
  [[ -z ${DEV[urnbd-mem]:-} ]] || "$URNBD_BIN" unmap "${DEV[urnbd-mem]}" >/dev/null 2>&1 || true
  [[ -z ${DEV[ublk-null]:-} ]] || "$URNBD_BIN" ublk del 7 >/dev/null 2>&1 || true
  [[ ! -d $NVMET/subsystems/$NQN ]] || nvme_teardown || true
  [[ -z $srv ]] || kill "$srv" 2>/dev/null || true
  ip -4 rule del pref 9 2>/dev/null || true
}
trap cleanup EXIT

"$URNBD_BIN" server --listen tcp://192.0.2.2:1237 --dev-search-path /dev --memory mem0=256M 2>/dev/null &
srv=$!
sleep 1
DEV[null_blk]=/dev/nullb2
DEV[ublk-null]=$("$URNBD_BIN" ublk add null --id 7 --size 4G)
DEV[urnbd-tcp]=$("$URNBD_BIN" map sessname=tcpparts transport=tcp dest_port=1237 path=ip:192.0.2.1@ip:192.0.2.2 device_path=nullb0)
DEV[urnbd-mem]=$("$URNBD_BIN" map sessname=tcpmem transport=tcp dest_port=1237 path=ip:192.0.2.1@ip:192.0.2.2 device_path=mem0)
fio --name=fill --filename="${DEV[urnbd-mem]}" --ioengine=io_uring --direct=1 --rw=write --bs=1m --iodepth=8 >/dev/null 2>&1
nvme_setup tcp /dev/nullb1
DEV[nvme-tcp]=$nvme_dev
names=(null_blk ublk-null urnbd-tcp urnbd-mem nvme-tcp)
[[ -x $bench ]] && names+=(rtrsbench) || echo "tcp-parts-lab: no $bench: no rtrsbench runs" >&2
ublk_null_pid=$(ublk_pid 7)
client_pid=$(cat "$URNBD_RUN_DIR/client.pid")

# threads FILE: every thread's CPU time so far (clock ticks), with its
# process, name, voluntary context switches and allowed CPUs, into FILE.
threads() {
  python3 - "$1" <<'PY'
import glob, sys
with open(sys.argv[1], "w") as out:
    for p in glob.glob("/proc/[0-9]*/task/[0-9]*/stat"):
        try:
            s = open(p).read()
            st = dict(l.split(":", 1) for l in open(p[:-4] + "status") if ":" in l)
        except OSError:
            continue
        comm, f = s[s.index("(") + 1:s.rindex(")")], s[s.rindex(")") + 2:].split()
        print(p.split("/")[2], p.split("/")[4], int(f[11]) + int(f[12]), comm.replace(" ", "_"),
              st["voluntary_ctxt_switches"].strip(), st["Cpus_allowed_list"].strip(), file=out)
PY
}
# others BEFORE AFTER IOS PID...: the three threads outside PIDs, fio and
# this script's own tools that took the most CPU between the two
# snapshots, as NAME=µs per I/O, threads of one kind (kworker/1:2,
# ksoftirqd/0) summed by kind.
others() {
  python3 - "$@" "$(getconf CLK_TCK)" <<'PY'
import re, sys
before, after, ios, *pids, hz = sys.argv[1:]
ios, hz, skip = max(int(ios), 1), int(hz), set(p for p in pids if p)
def load(path):
    return {(l.split()[0], l.split()[1]): (int(l.split()[2]), l.split()[3]) for l in open(path)}
b, a, by = load(before), load(after), {}
for k, (t, comm) in a.items():
    if k[0] in skip or comm in ("fio", "python3", "bash", "sed", "awk", "cat"):
        continue
    d = t - b.get(k, (0, comm))[0]
    if d > 0:
        kind = re.sub(r"/\d+(:\d+H?)?", "", comm)
        by[kind] = by.get(kind, 0) + d
top = sorted(by.items(), key=lambda x: -x[1])[:3]
print(" ".join(f"{k}={v * 1e6 / hz / ios:.1f}" for k, v in top) or "-")
PY
}

# busiest BEFORE AFTER IOS PID: the three threads of PID that took the
# most CPU between the two snapshots, as µs/switches per I/O@CPUs.
busiest() {
  [[ -n $4 ]] || { echo -; return; }
  python3 - "$@" "$(getconf CLK_TCK)" <<'PY'
import sys
before, after, ios, pid, hz = sys.argv[1:]
ios, hz = max(int(ios), 1), int(hz)
def load(path):
    return {l.split()[1]: (int(l.split()[2]), int(l.split()[4]), l.split()[5]) for l in open(path) if l.split()[0] == pid}
b, a = load(before), load(after)
rows = sorted(((t - b.get(k, (0, 0, ""))[0], v - b.get(k, (0, 0, ""))[1], c) for k, (t, v, c) in a.items()), reverse=True)[:3]
print(" ".join(f"{t * 1e6 / hz / ios:.0f}/{v / ios:.2f}@{c}" for t, v, c in rows) or "-")
PY
}

# irq_us: the VM's time in interrupts and softirqs so far, in µs (not
# counted to any thread where the kernel accounts it apart).
irq_us() {
  local cpu user nice sys idle iow irq sirq rest
  read -r cpu user nice sys idle iow irq sirq rest </proc/stat
  echo $(((irq + sirq) * 1000000 / $(getconf CLK_TCK)))
}

# ticks PID: the process's CPU time so far, in clock ticks (0 for no PID).
ticks() { if [[ -n $1 ]]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }

# run NAME RW BS: one run, one line to $out.
run() {
  local name=$1 rw=$2 bs=$3 daemon= server= i0 i1 c0 c1 q0 q1 t0 t1 d0 d1 s0 s1 iops fio_s ios procs
  case $name in
    ublk-null) daemon=$ublk_null_pid ;;
    urnbd-tcp | urnbd-mem) daemon=$client_pid server=$srv ;;
  esac
  if [[ $name == rtrsbench ]]; then
    j=$("$bench" -size 256M -dst 192.0.2.2 -src 192.0.2.1 -rw "$rw" -bs "$bs" -iodepth 32 -runtime "${runtime}s")
    # Its own measured window: the VM's busy µs in it, and its length.
    read -r iops ios c0 c1 t0 t1 procs <<<"$(python3 -c 'import json,sys; j=json.loads(sys.argv[1])
print(round(j["iops"]), j["ios"], 0, round(j["machine_busy_us_per_io"] * j["ios"]), 0, j["seconds"], "rtrsbench=%.1f" % j["cpu_us_per_io"])' "$j")"
  else
    d0=$(ticks "$daemon"); s0=$(ticks "$server"); threads /tmp/tcp-parts.0
    i0=$(dev_ios "${DEV[$name]}"); c0=$(vm_busy_us); q0=$(irq_us); t0=$(date +%s.%N)
    # The JSON goes to a file and is read after the counts: no python
    # start-up in the run's VM time.
    fio --output-format=json --output=/tmp/tcp-parts.json --name=b --filename="${DEV[$name]}" --ioengine=io_uring --direct=1 \
      --rw="$rw" --bs="$bs" --iodepth=32 --time_based --runtime="$runtime" >/dev/null 2>&1
    i1=$(dev_ios "${DEV[$name]}"); c1=$(vm_busy_us); q1=$(irq_us); t1=$(date +%s.%N)
    read -r iops fio_s <<<"$(python3 -c 'import json; j=json.load(open("/tmp/tcp-parts.json"))["jobs"][0]
print(round(j["read"]["iops"] + j["write"]["iops"]), (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["elapsed"])')"
    d1=$(ticks "$daemon"); s1=$(ticks "$server"); threads /tmp/tcp-parts.1
    ios=$((i1 - i0))
    procs=$(python3 -c 'import sys; ios, hz, fio, d, s, irq = max(int(sys.argv[1]), 1), int(sys.argv[2]), *map(float, sys.argv[3:])
print(f"fio={fio * 1e6 / ios:.1f} daemon={d * 1e6 / hz / ios:.1f} server={s * 1e6 / hz / ios:.1f} irq={irq / ios:.1f}")' \
      "$ios" "$(getconf CLK_TCK)" "$fio_s" "$((d1 - d0))" "$((s1 - s0))" "$((q1 - q0))")
    procs+=" others: $(others /tmp/tcp-parts.0 /tmp/tcp-parts.1 "$ios" "$daemon" "$server")"
    [[ -z $daemon ]] || procs+=" daemon-threads: $(busiest /tmp/tcp-parts.0 /tmp/tcp-parts.1 "$ios" "$daemon")"
    [[ -z $server ]] || procs+=" server-threads: $(busiest /tmp/tcp-parts.0 /tmp/tcp-parts.1 "$ios" "$server")"
  fi
  python3 -c 'import sys; name, rw, bs, iops, c, ios, t0, t1, procs = sys.argv[1:]; ios, w = max(int(ios), 1), f"{rw} {bs}"
print(f"{name:<10} {w:<13} {iops:>7} {int(c) / ios:9.1f} {int(c) / 1e6 / (float(t1) - float(t0)):6.2f}  {procs}")' \
    "$name" "$rw" "$bs" "$iops" "$((c1 - c0))" "$ios" "$t0" "$t1" "$procs" | tee -a "$out"
}

{
  echo "TCP path by parts, fio io_uring QD32, ${runtime}s, no perf attached; $(uname -r), $(nproc) vCPUs under qemu TCG"
  echo "CPU µs per I/O: the VM's (busy), and per process (fio, the ublk server 'daemon', the urnbd server)"
  printf '%-10s %-13s %7s %9s %6s  %s\n' config workload IOPS vm-us/io vm-cpu processes-us/io
} | tee "$out"
for ((r = 1; r <= rounds; r++)); do
  for w in "randread 4k" "randwrite 4k"; do
    for n in "${names[@]}"; do
      run "$n" $w
    done
  done
done
