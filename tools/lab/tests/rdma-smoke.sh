#!/usr/bin/env bash
# Soft-RoCE over both lab paths, inside the lab guest:
#   tools/lab/lab run -- tools/lab/tests/rdma-smoke.sh
#
# For each path (veth0/rxe0 192.0.2.1 <-> veth1/rxe1 192.0.2.2 and
# veth2/rxe2 198.51.100.1 <-> veth3/rxe3 198.51.100.2): rping (RDMA CM)
# and ibv_rc_pingpong (verbs, RoCE v2 GID of each address), and a check
# that both veths' tx_packets grew, i.e. the traffic did not take lo.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
PROVISION=$HERE/../provision.sh

say() { printf 'rdma-smoke: %s\n' "$*"; }
fail() { printf 'rdma-smoke: FAIL: %s\n' "$*" >&2; exit 1; }

tx() { cat "/sys/class/net/$1/statistics/tx_packets"; }

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

PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# check_path NAME VETH_A IP_A VETH_B IP_B RXE_A RXE_B PORT
check_path() {
	local name=$1 va=$2 ipa=$3 vb=$4 ipb=$5 ra=$6 rb=$7 port=$8
	local a0 b0 a1 b1 spid gida gidb

	a0=$(tx "$va") b0=$(tx "$vb")
	# rping: server on B, client from A.
	timeout 60 rping -s -a "$ipb" -p "$port" -C 50 -S 4096 >/dev/null 2>&1 &
	spid=$!
	PIDS+=("$spid")
	local ok=
	for ((i = 0; i < 30; i++)); do
		if timeout 60 rping -c -a "$ipb" -I "$ipa" -p "$port" -C 50 -S 4096 >/dev/null 2>&1; then
			ok=1
			break
		fi
		sleep 0.2
	done
	[[ -n $ok ]] || fail "$name: rping $ipa -> $ipb failed"
	wait "$spid" || fail "$name: rping server on $ipb failed"
	say "$name: rping $ipa -> $ipb: 50 pings ok"

	# ibv_rc_pingpong: verbs on the rxe devices themselves.
	gida=$(gid_index "$ra" "$ipa") || fail "$name: no RoCE v2 GID for $ipa on $ra"
	gidb=$(gid_index "$rb" "$ipb") || fail "$name: no RoCE v2 GID for $ipb on $rb"
	timeout 60 ibv_rc_pingpong -d "$rb" -g "$gidb" -p "$((port + 1))" -n 200 >/dev/null &
	spid=$!
	PIDS+=("$spid")
	ok=
	for ((i = 0; i < 30; i++)); do
		if timeout 60 ibv_rc_pingpong -d "$ra" -g "$gida" -p "$((port + 1))" -n 200 127.0.0.1 >"$TMPF" 2>&1; then
			ok=1
			break
		fi
		sleep 0.2
	done
	[[ -n $ok ]] || { cat "$TMPF" >&2; fail "$name: ibv_rc_pingpong $ra -> $rb failed"; }
	wait "$spid" || fail "$name: ibv_rc_pingpong server on $rb failed"
	say "$name: ibv_rc_pingpong $ra (gid $gida) -> $rb (gid $gidb): $(grep -m1 'iters in' "$TMPF" || echo ok)"

	a1=$(tx "$va") b1=$(tx "$vb")
	say "$name: $va tx +$((a1 - a0)) packets, $vb tx +$((b1 - b0)) packets"
	((a1 - a0 >= 100 && b1 - b0 >= 100)) ||
		fail "$name: traffic did not cross $va <-> $vb ($va +$((a1 - a0)), $vb +$((b1 - b0)))"
}

[[ $EUID -eq 0 ]] || fail "must run as root (in the lab guest)"
TMPF=$(mktemp)
"$PROVISION" rdma || fail "provision.sh rdma"
ibv_devices
check_path path1 veth0 192.0.2.1 veth1 192.0.2.2 rxe0 rxe1 7471
check_path path2 veth2 198.51.100.1 veth3 198.51.100.2 rxe2 rxe3 7473
rm -f "$TMPF"
say "PASS"
