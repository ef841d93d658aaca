#!/usr/bin/env bash
# Interoperability with the kernel's RNBD/RTRS over soft-RoCE, both ways,
# each with fio --verify=crc32c (0 errors required):
#   1. the kernel's rnbd_client maps a file exported by `urnbd server`;
#   2. `urnbd map transport=rdma` maps /dev/nullb0 from the kernel's
#      rnbd_server (always_invalidate=Y, its default);
#   3. a `urnbd server --auth-keys` refuses the kernel client (EACCES,
#      with an audit line) and a urnbd client with another key, and serves
#      a urnbd client that proves its key;
#   4. a flush (fsync of the mapped device: the block layer's pure
#      preflush) reaches the backend as a flush, both ways: the backend is
#      a null_blk with a volatile write cache, which counts the flushes it
#      completes;
#   5. `urnbd resize` of a device mapped from the kernel's rnbd_server
#      follows its loop device as it grows (the kernel's server answers a
#      repeated open with the size now), and I/O reaches the part it grew
#      by; without the ublk driver's update_size (6.12) resize is refused
#      with EOPNOTSUPP.
# Needs the kernel modules built by `tools/lab/lab build-rnbd` and URNBD_BIN.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
prov=$here/../provision.sh
urnbd=${URNBD_BIN:?URNBD_BIN must name the urnbd binary}
export URNBD_RUN_DIR=/run/urnbd-interop
say() { printf 'rnbd-interop: %s\n' "$*"; }
fail() { printf 'rnbd-interop: FAIL: %s\n' "$*" >&2; dmesg | grep -iE 'rtrs|rnbd' | tail -20 >&2; exit 1; }

listening() { # listening PID LOG: wait until the server says it listens
  local _
  for _ in $(seq 100); do
    grep -q "listening on" "$2" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || fail "urnbd server exited: $(tail -5 "$2")"
    sleep 0.1
  done
  fail "urnbd server does not listen after 10 s: $(tail -5 "$2")"
}

verify() { # verify DEV
  fio --name=interop --filename="$1" --ioengine=libaio --direct=1 --rw=randrw --bsrange=4k-64k \
      --iodepth=16 --size=64M --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
      --output-format=terse >/tmp/interop-fio.txt 2>&1 || fail "fio verify on $1: $(tail -3 /tmp/interop-fio.txt)"
}

LAB_ARGS_NULL_BLK="nr_devices=1 memory_backed=1 gb=1" "$prov" modules >/dev/null
"$prov" rdma >/dev/null
"$prov" rnbd >/dev/null

say "1. kernel rnbd_client -> urnbd server over RDMA"
modprobe -r rnbd_server 2>/dev/null || true # frees RDMA CM port 1234
mkdir -p /tmp/interop && truncate -s 256M /tmp/interop/disk.img
"$urnbd" server --listen rdma://192.0.2.2:1234 --dev-search-path /tmp/interop 2>/tmp/interop-server.log &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
listening $srv /tmp/interop-server.log
echo "sessname=interop path=ip:192.0.2.1,ip:192.0.2.2 device_path=disk.img" \
  >/sys/devices/virtual/rnbd-client/ctl/map_device || fail "kernel map_device; server log: $(tail -5 /tmp/interop-server.log)"
for _ in $(seq 50); do [ -b /dev/rnbd0 ] && break; sleep 0.1; done
[ -b /dev/rnbd0 ] || fail "/dev/rnbd0 did not appear"
verify /dev/rnbd0
echo normal >/sys/block/rnbd0/rnbd/unmap_device || fail "kernel unmap"
kill "$srv"; wait "$srv" 2>/dev/null || true
trap - EXIT
say "1. PASS: fio verify through the kernel client and our server"

say "2. urnbd client -> kernel rnbd_server over RDMA"
modprobe rnbd_server dev_search_path=/ || fail "modprobe rnbd_server"
dev=$("$urnbd" map sessname=interop2 transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=/dev/nullb0) ||
  fail "urnbd map from the kernel server"
verify "$dev"
"$urnbd" unmap "$dev" >/dev/null || fail "urnbd unmap"
say "2. PASS: fio verify through our client and the kernel server"

say "3. authentication: urnbd server --auth-keys over RDMA"
modprobe -r rnbd_server || fail "modprobe -r rnbd_server"
rm -f /tmp/interop/*.key
"$urnbd" key generate --out /tmp/interop/server.key lab || fail "key generate"
cp -p /tmp/interop/server.key /tmp/interop/client.key
"$urnbd" key generate --out /tmp/interop/other.key lab2 || fail "key generate"
"$urnbd" server --listen rdma://192.0.2.2:1234 --dev-search-path /tmp/interop --auth-keys /tmp/interop/server.key 2>/tmp/interop-auth.log &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
listening $srv /tmp/interop-auth.log
if echo "sessname=interop3k path=ip:192.0.2.1,ip:192.0.2.2 device_path=disk.img" \
    >/sys/devices/virtual/rnbd-client/ctl/map_device 2>/tmp/interop-kmap.err; then
  fail "the kernel client mapped from a server that requires authentication"
fi
say "   kernel client refused: $(cat /tmp/interop-kmap.err)"
grep -q "refused: the client does not authenticate" /tmp/interop-auth.log ||
  fail "no audit line for the kernel client: $(tail -5 /tmp/interop-auth.log)"
if out=$("$urnbd" map sessname=interop3w transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=disk.img auth_key=/tmp/interop/other.key 2>&1); then
  fail "a client with another key mapped: $out"
fi
case $out in *'refused key "lab2"'*) ;; *) fail "wrong key: no clear error: $out" ;; esac
say "   client with another key refused: $out"
dev=$("$urnbd" map sessname=interop3 transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=disk.img auth_key=/tmp/interop/client.key) ||
  fail "urnbd map with the key"
verify "$dev"
"$urnbd" unmap "$dev" >/dev/null || fail "urnbd unmap"
kill "$srv"; wait "$srv" 2>/dev/null || true
trap - EXIT
say "3. PASS: kernel client and wrong key refused, fio verify with the key"

say "4. flushes reach the backend, both ways"
cfg=/sys/kernel/config/nullb/flushdev
[ -d /sys/kernel/config/nullb ] || fail "no null_blk configfs (/sys/kernel/config/nullb)"
mkdir -p "$cfg"
echo 64 >"$cfg/size"           # MiB
echo 1 >"$cfg/memory_backed"
echo 16 >"$cfg/cache_size"     # MiB of volatile write cache: flushes mean something
echo 1 >"$cfg/power"
# The disk is named after the configfs folder (on 6.12 and 7.3; older
# kernels named it nullb<index>).
fdev=
for _ in $(seq 50); do
  for fdev in flushdev "nullb$(cat "$cfg/index")"; do [ -b "/dev/$fdev" ] && break 2; done
  sleep 0.1
done
[ -b "/dev/$fdev" ] || fail "no block device for $cfg (index $(cat "$cfg/index")): $(ls /sys/block)"
grep -q 'write back' "/sys/block/$fdev/queue/write_cache" || fail "/dev/$fdev has no volatile cache"
flushes() { awk '{print $16}' "/sys/block/$fdev/stat"; } # flush requests completed
flushed() { # flushed DEV WHAT: a write, then fsync of DEV; the backend must count a flush
  dd if=/dev/urandom of="$1" bs=4k count=1 oflag=direct status=none || fail "$2: write to $1"
  local f0 f1
  f0=$(flushes)
  sync "$1" || fail "$2: fsync $1"
  f1=$(flushes)
  ((f1 > f0)) || fail "$2: fsync of $1 reached /dev/$fdev as no flush ($f0 before, $f1 after)"
  say "   $2: fsync of $1 made /dev/$fdev complete $((f1 - f0)) flush(es)"
}
"$urnbd" server --listen rdma://192.0.2.2:1234 --dev-search-path /dev 2>/tmp/interop-flush.log &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
listening $srv /tmp/interop-flush.log
echo "sessname=interop4 path=ip:192.0.2.1,ip:192.0.2.2 device_path=$fdev" \
  >/sys/devices/virtual/rnbd-client/ctl/map_device || fail "kernel map_device $fdev: $(tail -5 /tmp/interop-flush.log)"
kdev=
for _ in $(seq 50); do
  kdev=$(grep -l "^$fdev\$" /sys/block/rnbd*/rnbd/mapping_path 2>/dev/null | head -1 | cut -d/ -f4) || true
  [ -n "$kdev" ] && [ -b "/dev/$kdev" ] && break
  sleep 0.1
done
[ -n "$kdev" ] && [ -b "/dev/$kdev" ] || fail "no /dev/rnbdN for $fdev"
flushed "/dev/$kdev" "kernel client $(uname -r) -> urnbd server"
echo normal >"/sys/block/$kdev/rnbd/unmap_device" || fail "kernel unmap"
kill "$srv"; wait "$srv" 2>/dev/null || true
trap - EXIT
modprobe rnbd_server dev_search_path=/ || fail "modprobe rnbd_server"
dev=$("$urnbd" map sessname=interop5 transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=/dev/$fdev) ||
  fail "urnbd map /dev/$fdev from the kernel server"
flushed "$dev" "urnbd client -> kernel server $(uname -r)"
"$urnbd" unmap "$dev" >/dev/null || fail "urnbd unmap"
modprobe -r rnbd_server || true
echo 0 >"$cfg/power"; rmdir "$cfg"
say "4. PASS: a flush reaches the backend through our server and through our client"

say "5. resize to the kernel server's device size"
modprobe rnbd_server dev_search_path=/ || fail "modprobe rnbd_server"
truncate -s 64M /tmp/interop/grow.img
loop=$(losetup --find --show /tmp/interop/grow.img) || fail "losetup"
trap 'losetup -d $loop 2>/dev/null || true' EXIT
dev=$("$urnbd" map sessname=interop6 transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path="$loop") ||
  fail "urnbd map $loop from the kernel server"
truncate -s 128M /tmp/interop/grow.img
losetup -c "$loop" || fail "losetup -c $loop"
[ "$(blockdev --getsize64 "$loop")" = 134217728 ] || fail "$loop did not grow to 128 MiB"
if "$urnbd" list --format json | grep -q '"update_size"'; then
  out=$("$urnbd" resize "$dev" 2>&1) || fail "urnbd resize $dev: $out"
  [ "$(blockdev --getsize64 "$dev")" = 134217728 ] || fail "$dev is $(blockdev --getsize64 "$dev") bytes after resize, want 134217728 ($out)"
  dd if=/dev/urandom of=/tmp/interop/tail.bin bs=64k count=1 status=none
  dd if=/tmp/interop/tail.bin of="$dev" bs=64k seek=2000 oflag=direct status=none || fail "write beyond the old end of $dev"
  # (no process substitution: the lab guest has no /dev/fd)
  dd if="$loop" of=/tmp/interop/tail.back bs=64k skip=2000 count=1 iflag=direct status=none || fail "read $loop"
  cmp /tmp/interop/tail.back /tmp/interop/tail.bin || fail "what was written beyond the old end of $dev is not on $loop"
  say "5. PASS: $out, and I/O beyond the old end reaches $loop"
else
  set +e
  out=$("$urnbd" resize "$dev" 2>&1)
  rc=$?
  set -e
  [ $rc = 95 ] || fail "urnbd resize without update_size: exit $rc, want 95 (EOPNOTSUPP): $out"
  [ "$(blockdev --getsize64 "$dev")" = 67108864 ] || fail "$dev changed size on a refused resize"
  say "5. PASS: no update_size in this kernel's ublk driver: resize refused (EOPNOTSUPP), size unchanged"
fi
"$urnbd" unmap "$dev" >/dev/null || fail "urnbd unmap"
losetup -d "$loop"
trap - EXIT
modprobe -r rnbd_server || true
