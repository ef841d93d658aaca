#!/usr/bin/env bash
# Runs in the lab VM: what the soft-RoCE link itself can do, next to what
# urnbd's RTRS over RDMA gets out of it, same VM, same run, same path
# (rxe0 192.0.2.1 -> rxe1 192.0.2.2), message sizes 4k and 128k:
#   perftest  ib_write_bw (1 QP, tx depth 128), ib_write_lat, ib_read_lat
#             (server on rxe1, client on rxe0, RoCE v2 GIDs of the two
#             addresses)
#   urnbd     tools/rtrsbench -transport rdma: rtrs/rdmatr client and server
#             with a memory backend in one process, the server listening on
#             192.0.2.2, the client connecting from 192.0.2.1; one queue (one
#             QP) with QD1 for latency, QD32 for bandwidth
# Writes $LAB_OUT/rdma-ceiling.txt (and the raw outputs next to it).
#
#   RTRSBENCH   the rtrsbench binary (default .cache/lab/bin/rtrsbench,
#               built by tools/bench/run.sh)
#   URNBD_BENCH_RUNTIME   seconds per bandwidth run (default 5)
#   URNBD_BENCH_LAT_ITERS iterations per perftest latency run (default 2000)
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd -- "$here/../.." && pwd -P)
prov=$root/tools/lab/provision.sh
bench=${RTRSBENCH:-$root/.cache/lab/bin/rtrsbench}
runtime=${URNBD_BENCH_RUNTIME:-5}
iters=${URNBD_BENCH_LAT_ITERS:-2000}
out=${LAB_OUT:-/tmp}
raw=$out/rdma-ceiling-raw
CLI_IP=192.0.2.1 SRV_IP=192.0.2.2 CLI_DEV=rxe0 SRV_DEV=rxe1 CLI_NET=veth0 SRV_NET=veth1

die() { printf 'rdma-ceiling: error: %s\n' "$*" >&2; exit 1; }
[[ $EUID -eq 0 ]] || die "must run as root (in the lab: tools/lab/lab run -- $0)"
[[ -x $bench ]] || die "no $bench: go build -o .cache/lab/bin/rtrsbench ./tools/rtrsbench"
for c in ib_write_bw ib_write_lat ib_read_lat python3; do
	command -v "$c" >/dev/null || die "$c not found (perftest, python3)"
done
mkdir -p "$raw"

"$prov" modules >/dev/null
"$prov" rdma >/dev/null

# gid_index RXE IP: index of IP's RoCE v2 GID on port 1 of RXE.
gid_index() {
	local dev=$1 ip=$2 want f idx o
	IFS=. read -ra o <<<"$ip"
	want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "${o[@]}")
	for f in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
		idx=${f##*/}
		[[ $(<"$f") == "$want" ]] || continue
		[[ $(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$idx" 2>/dev/null) == "RoCE v2" ]] || continue
		printf '%s\n' "$idx"
		return
	done
	return 1
}
cli_gid=$(gid_index $CLI_DEV $CLI_IP) || die "no RoCE v2 GID for $CLI_IP on $CLI_DEV"
srv_gid=$(gid_index $SRV_DEV $SRV_IP) || die "no RoCE v2 GID for $SRV_IP on $SRV_DEV"

spid=
cleanup() { [[ -z $spid ]] || kill "$spid" 2>/dev/null || true; }
trap cleanup EXIT

tx() { cat "/sys/class/net/$1/statistics/tx_bytes"; }
tx0_cli=$(tx $CLI_NET) tx0_srv=$(tx $SRV_NET)

port=18600
# perf NAME TOOL ARGS...: server on rxe1, then the client on rxe0 (retried
# until the server listens); the client's output goes to $raw/NAME.txt.
perf() {
	local name=$1 tool=$2 ok="" i
	shift 2
	port=$((port + 1))
	timeout 300 "$tool" -d $SRV_DEV -x "$srv_gid" -p $port -F "$@" >"$raw/$name.server.txt" 2>&1 &
	spid=$!
	for ((i = 0; i < 50; i++)); do
		sleep 0.3
		if timeout 300 "$tool" -d $CLI_DEV -x "$cli_gid" -p $port -F "$@" $SRV_IP >"$raw/$name.txt" 2>&1; then
			ok=1
			break
		fi
		kill -0 "$spid" 2>/dev/null || break
	done
	[[ -n $ok ]] || { cat "$raw/$name.txt" "$raw/$name.server.txt" >&2; die "$tool $* failed"; }
	wait "$spid" || die "$tool server ($*) failed: $(tail -3 "$raw/$name.server.txt")"
	spid=
}
# get FILE SIZE COLUMN...: columns of perftest's result row for SIZE.
get() {
	local v
	v=$(awk -v s="$2" -v c="${*:3}" '$1 == s && NF >= 5 { n = split(c, k, " "); for (i = 1; i <= n; i++) printf "%s%s", $k[i], (i < n ? " " : ""); exit }' "$1")
	[[ -n $v ]] || die "no result row for size $2 in $1: $(tail -5 "$1")"
	printf '%s\n' "$v"
}
# ours NAME ARGS...: rtrsbench over RDMA, its JSON in $raw/rtrsbench_NAME.json.
ours() {
	local name=$1
	shift
	timeout 300 "$bench" -transport rdma -src $CLI_IP -dst $SRV_IP -size 256M -queues 1 "$@" \
		>"$raw/rtrsbench_$name.json" 2>"$raw/rtrsbench_$name.err" ||
		die "rtrsbench $* failed: $(tail -5 "$raw/rtrsbench_$name.err")"
}
# jget NAME KEY...: values from rtrsbench's JSON.
jget() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(" ".join(f"{j[k]:.1f}" for k in sys.argv[2:]))' "$raw/rtrsbench_$1.json" "${@:2}"; }

declare -A R
for s in 4096 131072; do
	k=$((s / 1024))k
	# perftest: bandwidth column 4 (BW average); latency columns 6 (t_avg) and 8 (99%).
	perf "write_bw_$k" ib_write_bw -s $s -D "$runtime"
	R[bw,$s]=$(get "$raw/write_bw_$k.txt" $s 4)
	perf "write_lat_$k" ib_write_lat -s $s -n "$iters"
	R[wlat,$s]=$(get "$raw/write_lat_$k.txt" $s 6 8)
	perf "read_lat_$k" ib_read_lat -s $s -n "$iters"
	R[rlat,$s]=$(get "$raw/read_lat_$k.txt" $s 6 8)
	ours "read_bw_$k" -rw read -bs $k -iodepth 32 -runtime "${runtime}s"
	R[ours_rbw,$s]=$(jget "read_bw_$k" mib_s iops)
	ours "write_bw_$k" -rw write -bs $k -iodepth 32 -runtime "${runtime}s"
	R[ours_wbw,$s]=$(jget "write_bw_$k" mib_s iops)
	ours "read_lat_$k" -rw randread -bs $k -iodepth 1 -runtime "${runtime}s"
	R[ours_rlat,$s]=$(jget "read_lat_$k" lat_mean_us lat_p99_us)
	ours "write_lat_$k" -rw randwrite -bs $k -iodepth 1 -runtime "${runtime}s"
	R[ours_wlat,$s]=$(jget "write_lat_$k" lat_mean_us lat_p99_us)
done
tx1_cli=$(tx $CLI_NET) tx1_srv=$(tx $SRV_NET)

f() { awk -v v="$1" -v i="${2:-1}" 'BEGIN { split(v, a, " "); printf "%.0f", a[i] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
{
	echo "soft-RoCE link ceiling vs urnbd RTRS over RDMA: rxe0 $CLI_IP -> rxe1 $SRV_IP; $(uname -r), $(nproc) vCPUs under qemu TCG"
	echo "perftest: 1 QP, ib_write_bw tx depth 128 for ${runtime}s, latency tests $iters iterations; rtrsbench: 1 queue (1 QP), ${runtime}s per run"
	echo
	echo "bandwidth, MiB/s:"
	printf '%-8s %14s %18s %18s %10s %10s\n' size ib_write_bw "urnbd read QD32" "urnbd write QD32" "read/ib" "write/ib"
	for s in 4096 131072; do
		printf '%-8s %14s %18s %18s %10s %10s\n' $((s / 1024))k "$(f "${R[bw,$s]}")" "$(f "${R[ours_rbw,$s]}")" "$(f "${R[ours_wbw,$s]}")" \
			"$(ratio "$(f "${R[ours_rbw,$s]}")" "${R[bw,$s]}")" "$(ratio "$(f "${R[ours_wbw,$s]}")" "${R[bw,$s]}")"
	done
	echo
	echo "latency, µs, mean / p99 (ib_write_lat reports half a round trip, ib_read_lat and urnbd a whole request):"
	printf '%-8s %16s %16s %16s %18s %18s\n' size ib_write_lat "2×ib_write_lat" ib_read_lat "urnbd read QD1" "urnbd write QD1"
	for s in 4096 131072; do
		printf '%-8s %16s %16s %16s %18s %18s\n' $((s / 1024))k \
			"$(f "${R[wlat,$s]}") / $(f "${R[wlat,$s]}" 2)" \
			"$(awk -v v="${R[wlat,$s]}" 'BEGIN { split(v, a, " "); printf "%.0f / %.0f", 2 * a[1], 2 * a[2] }')" \
			"$(f "${R[rlat,$s]}") / $(f "${R[rlat,$s]}" 2)" \
			"$(f "${R[ours_rlat,$s]}") / $(f "${R[ours_rlat,$s]}" 2)" \
			"$(f "${R[ours_wlat,$s]}") / $(f "${R[ours_wlat,$s]}" 2)"
	done
	echo
	for s in 4096 131072; do
		printf 'ratio urnbd read latency / ib_read_lat (mean), %s: %s\n' $((s / 1024))k "$(ratio "$(f "${R[ours_rlat,$s]}")" "$(f "${R[rlat,$s]}")")"
		printf 'ratio urnbd write latency / 2×ib_write_lat (mean), %s: %s\n' $((s / 1024))k "$(ratio "$(f "${R[ours_wlat,$s]}")" "$(awk -v v="${R[wlat,$s]}" 'BEGIN { split(v, a, " "); print 2 * a[1] }')")"
	done
	echo "veth tx bytes during the run: $CLI_NET $((tx1_cli - tx0_cli)), $SRV_NET $((tx1_srv - tx0_srv)) (the traffic crossed the veth pair)"
} | tee "$out/rdma-ceiling.txt"
