#!/usr/bin/env bash
# Kernel RNBD over soft-RoCE, inside the lab guest:
#   tools/lab/lab build-rnbd && tools/lab/lab run -- tools/lab/tests/kernel-rnbd-smoke.sh
#
# The kernel's rnbd_client maps /dev/nullb0 exported by the kernel's
# rnbd_server over path 1 (192.0.2.1 rxe0 -> 192.0.2.2 rxe1), checks that
# the traffic crossed the veth pair, writes, reads back and verifies data
# (null_blk memory-backed), runs fio for a few seconds if present, unmaps.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
PROVISION=$HERE/../provision.sh
SESS=lab-smoke-$$
SRC=192.0.2.1 DST=192.0.2.2
CTL=/sys/devices/virtual/rnbd-client/ctl/map_device
# memory_backed lets the test compare data (only if null_blk is not loaded yet).
export LAB_ARGS_NULL_BLK=${LAB_ARGS_NULL_BLK-nr_devices=1 memory_backed=1}

say() { printf 'kernel-rnbd-smoke: %s\n' "$*"; }
fail() { printf 'kernel-rnbd-smoke: FAIL: %s\n' "$*" >&2; exit 1; }

tx() { cat "/sys/class/net/$1/statistics/tx_packets"; }

DEV=''
TMP=$(mktemp -d)
cleanup() {
	if [[ -n $DEV && -e /sys/block/$DEV/rnbd/unmap_device ]]; then
		echo force >"/sys/block/$DEV/rnbd/unmap_device" 2>/dev/null || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

[[ $EUID -eq 0 ]] || fail "must run as root (in the lab guest)"
"$PROVISION" modules || fail "provision.sh modules"
"$PROVISION" rdma >/dev/null || fail "provision.sh rdma"
"$PROVISION" rnbd || fail "provision.sh rnbd"
[[ -b /dev/nullb0 ]] || fail "no /dev/nullb0"

before0=$(tx veth0) before1=$(tx veth1)

say "mapping /dev/nullb0 over $SRC -> $DST"
t0=$EPOCHREALTIME
echo "sessname=$SESS path=ip:$SRC,ip:$DST device_path=/dev/nullb0" >"$CTL" ||
	fail "map_device failed (dmesg: $(dmesg | tail -5 | tr '\n' ' '))"
for ((i = 0; i < 100; i++)); do
	for d in /sys/block/rnbd*; do
		[[ -f $d/rnbd/session ]] || continue
		if [[ $(<"$d/rnbd/session") == "$SESS" ]]; then
			DEV=${d##*/}
			break 2
		fi
	done
	sleep 0.1
done
[[ -n $DEV ]] || fail "no rnbd device with session $SESS appeared"
for ((i = 0; i < 50; i++)); do [[ -b /dev/$DEV ]] && break; sleep 0.1; done
[[ -b /dev/$DEV ]] || fail "/dev/$DEV did not appear"
say "mapped /dev/$DEV in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2fs", b - a }'):" \
	"state=$(<"/sys/block/$DEV/rnbd/state") access_mode=$(<"/sys/block/$DEV/rnbd/access_mode")" \
	"size=$(($(<"/sys/block/$DEV/size") * 512)) bytes"

# Write a pattern through rnbd, read it back through rnbd and on the server.
MB=8
dd if=/dev/urandom of="$TMP/pattern" bs=1M count=$MB status=none
dd if="$TMP/pattern" of="/dev/$DEV" bs=1M oflag=direct conv=fsync status=none ||
	fail "write to /dev/$DEV failed"
dd if="/dev/$DEV" of="$TMP/back" bs=1M count=$MB iflag=direct status=none ||
	fail "read from /dev/$DEV failed"
if [[ $(cat /sys/module/null_blk/parameters/memory_backed 2>/dev/null) == Y ]]; then
	cmp -s "$TMP/pattern" "$TMP/back" || fail "data read back through /dev/$DEV differs from what was written"
	dd if=/dev/nullb0 of="$TMP/server" bs=1M count=$MB iflag=direct status=none
	cmp -s "$TMP/pattern" "$TMP/server" || fail "data on the server's /dev/nullb0 differs from what was written"
	say "wrote, read back and verified ${MB} MiB"
else
	say "wrote and read ${MB} MiB (null_blk not memory-backed: data not verified)"
fi

if command -v fio >/dev/null; then
	out=${LAB_OUT:-$TMP}
	fio --name=rnbd-smoke --filename="/dev/$DEV" --direct=1 --ioengine=libaio \
		--rw=randrw --bs=4k --iodepth=16 --size=64M --runtime=3 --time_based \
		--output-format=json --output="$out/kernel-rnbd-fio.json" >/dev/null ||
		fail "fio on /dev/$DEV failed"
	iops=$(awk -F': ' '/"iops"/ { gsub(/,/, "", $2); s += $2 } END { printf "%d", s }' "$out/kernel-rnbd-fio.json")
	errs=$(awk -F': ' '/"error"/ { gsub(/,/, "", $2); s += $2 } END { printf "%d", s }' "$out/kernel-rnbd-fio.json")
	((errs == 0)) || fail "fio reported errors"
	say "fio 4k randrw QD16 3s: about $iops IOPS (read+write)"
fi

after0=$(tx veth0) after1=$(tx veth1)
d0=$((after0 - before0)) d1=$((after1 - before1))
say "veth0 tx +$d0 packets, veth1 tx +$d1 packets"
((d0 > 1000 && d1 > 1000)) || fail "traffic did not cross the veth pair (veth0 +$d0, veth1 +$d1)"

echo normal >"/sys/block/$DEV/rnbd/unmap_device" || fail "unmap of $DEV failed"
for ((i = 0; i < 50; i++)); do [[ -e /sys/block/$DEV ]] || break; sleep 0.1; done
[[ ! -e /sys/block/$DEV ]] || fail "$DEV still present after unmap"
DEV=''
say "unmapped; PASS"
