#!/usr/bin/env bash
# Runs in the lab VM: how long the window of a failed-over request stays
# open with the kernel's rnbd_client as the peer (it has no fence). The
# kernel client maps a file from `urnbd server` over two soft-RoCE paths
# under fio; path 1 is then cut (netem loss 100% on both veths). The
# window is the time from the client giving path 1 up (its sysfs state
# leaves CONNECTED, its requests fail over to path 2) to the server
# closing path 1 (from then on none of its requests starts). Prints both
# times from the cut, ROUNDS times (default 3).
# Needs the kernel modules built by `tools/lab/lab build-rnbd` and URNBD_BIN.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
prov=$here/../lab/provision.sh
urnbd=${URNBD_BIN:?URNBD_BIN must name the urnbd binary}
say() { printf 'kernel-peer-window: %s\n' "$*"; }
"$prov" modules >/dev/null
"$prov" rdma >/dev/null
"$prov" rnbd >/dev/null
modprobe sch_netem
modprobe -r rnbd_server 2>/dev/null || true
mkdir -p /tmp/kpw && truncate -s 256M /tmp/kpw/disk.img
now() { date +%s.%N; }
uncut() { tc qdisc del dev veth0 root 2>/dev/null || true; tc qdisc del dev veth1 root 2>/dev/null || true; }
srv=
cleanup() {
  uncut
  [[ -b /dev/rnbd0 ]] && echo force >/sys/block/rnbd0/rnbd/unmap_device 2>/dev/null || true
  [[ -z $srv ]] || kill "$srv" 2>/dev/null || true
}
trap cleanup EXIT
for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
  log=/tmp/kpw/server-$round.log
  "$urnbd" server --listen rdma://192.0.2.2:1234 --listen rdma://198.51.100.2:1234 --dev-search-path /tmp/kpw 2>"$log" &
  srv=$!
  sleep 1
  echo "sessname=kpw path=ip:192.0.2.1,ip:192.0.2.2 path=ip:198.51.100.1,ip:198.51.100.2 device_path=disk.img" \
    >/sys/devices/virtual/rnbd-client/ctl/map_device
  for _ in $(seq 50); do [[ -b /dev/rnbd0 ]] && break; sleep 0.1; done
  st=$(ls -d /sys/class/rtrs-client/kpw/paths/*192.0.2.2* | head -1)/state
  say "client path 1 before the cut: $(cat "$st")"
  fio --name=kpw --filename=/dev/rnbd0 --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=16 \
      --time_based --runtime=120 >/dev/null 2>&1 &
  fio=$!
  sleep 3
  t0=$(now)
  tc qdisc add dev veth0 root netem loss 100%
  tc qdisc add dev veth1 root netem loss 100%
  tc_client= tc_server=
  while [[ -z $tc_client || -z $tc_server ]]; do
    t=$(now)
    s=$(cat "$st"); s=${s^^}
    if [[ -z $tc_client ]] && ! [[ $s == *CONNECTED* && $s != *RECONNECT* && $s != *DISCONNECT* ]]; then
      tc_client=$(python3 -c "print(f'{$t - $t0:.2f}')"); say "client path 1: $s"
    fi
    if [[ -z $tc_server ]] && grep -qE 'path 192\.0\.2\.2:1234[: ].*(missed|DISCONNECTED|status|closes the path|posting)' "$log"; then
      tc_server=$(python3 -c "print(f'{$t - $t0:.2f}')")
    fi
    if python3 -c "import sys; sys.exit(0 if $t - $t0 > 90 else 1)"; then break; fi
    sleep 0.05
  done
  say "round $round: client gave path 1 up after ${tc_client:-never} s, server closed it after ${tc_server:-never} s"
  kill "$fio" 2>/dev/null || true; wait "$fio" 2>/dev/null || true
  uncut
  echo force >/sys/block/rnbd0/rnbd/unmap_device || true
  kill "$srv"; wait "$srv" 2>/dev/null || true; srv=
  sleep 2
done
