#!/usr/bin/env bash
# tools/bench/build-kublk.sh: builds the kernel's own ublk server, the ublk
# selftest "kublk" of Linux 7.3 (tools/testing/selftests/ublk, C and
# liburing), as a static x86-64 binary: the peer that tools/bench/ublk-lab.sh
# compares urnbd's ublk queues with (URNBD_KUBLK). Its sources come from
# Debian's linux-source-7.3, which `tools/lab/lab --kernel 7 build-rnbd`
# downloads for the lab's out-of-tree rtrs/rnbd build; prints the binary's
# path last.
#
# The host (Debian 12) has a too-old liburing, so the build runs inside a
# Debian trixie chroot (liburing 2.9), created on first use with debootstrap.
# The 7.3 UAPI headers (ublk_cmd.h, io_uring.h, io_uring/*.h, fs.h) are taken
# from the partially extracted tree in $K7SRC, sanitised the way
# "make headers_install" does, and put first on the include path so that
# <linux/ublk_cmd.h> and <linux/io_uring.h> resolve to the 7.3 versions.
#
# Usage: build-kublk.sh            (re-runnable; reuses an existing chroot)
#        FRESH=1 build-kublk.sh    (delete and re-create the chroot first)
set -euo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)
CACHE=$root/.cache
ROOT=${ROOT:-$CACHE/kublk-root}
K7SRC=${K7SRC:-$CACHE/k7src}
OUT=${OUT:-$CACHE/lab/bin/kublk}
DEB=${DEB:-$(ls "$CACHE"/lab/k7/debs/linux-source-7.3_*_all.deb 2>/dev/null | tail -1)}
[[ -f $DEB ]] || { echo "build-kublk: no linux-source-7.3 deb in $CACHE/lab/k7/debs (run tools/lab/lab --kernel 7 build-rnbd)" >&2; exit 1; }
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SELFTEST=tools/testing/selftests/ublk
UAPI_NEEDED="include/uapi/linux/ublk_cmd.h include/uapi/linux/io_uring.h include/uapi/linux/io_uring include/uapi/linux/fs.h"

log() { echo "== $*" >&2; }

# 1. Kernel sources: extract from the linux-source deb if anything is missing.
missing=()
for p in $SELFTEST/kublk.c $UAPI_NEEDED; do
	[ -e "$K7SRC/$p" ] || missing+=("linux-source-7.3/$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "extracting ${missing[*]} from $DEB"
	mkdir -p "$K7SRC"
	# always take the whole selftest dir when anything is missing
	dpkg-deb --fsys-tarfile "$DEB" | tar -xO ./usr/src/linux-source-7.3.tar.xz |
		tar -xJ -C "$K7SRC" --strip-components=1 \
			linux-source-7.3/$SELFTEST "${missing[@]}"
fi

# 2. Debian trixie chroot with gcc, make, liburing-dev.
if [ "${FRESH:-0}" = 1 ] && [ -d "$ROOT" ]; then
	log "removing old chroot $ROOT"
	for m in proc dev; do mountpoint -q "$ROOT/$m" && umount -l "$ROOT/$m"; done
	rm -rf --one-file-system "$ROOT"
fi
if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
	command -v debootstrap >/dev/null || { apt-get update; apt-get install -y debootstrap; }
	log "debootstrap trixie -> $ROOT"
	rm -rf --one-file-system "$ROOT"
	debootstrap --variant=minbase trixie "$ROOT" "$MIRROR"
fi
if ! chroot "$ROOT" sh -c 'command -v gcc && command -v make && test -f /usr/lib/x86_64-linux-gnu/liburing.a' >/dev/null 2>&1; then
	log "installing gcc make liburing-dev in chroot"
	cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
	chroot "$ROOT" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends gcc make libc6-dev liburing-dev'
fi

# 3. Stage sources + sanitised 7.3 UAPI headers inside the chroot.
B=$ROOT/build/kublk
rm -rf "$B"
mkdir -p "$B/src" "$B/usr/include"
cp -a "$K7SRC/$SELFTEST/." "$B/src/"
# Same transformation as scripts/headers_install.sh (strip __user/__force,
# fix _UAPI guards, etc.), applied to every UAPI header present in k7src.
(cd "$K7SRC/include/uapi" && find . -name '*.h') | while read -r h; do
	mkdir -p "$B/usr/include/$(dirname "$h")"
	sed -E -e '
		s/([[:space:](])(__user|__force|__iomem)[[:space:]]/\1/g
		s/__attribute_const__([[:space:]]|$)/\1/g
		s@^#include <linux/compiler(|_types).h>@@
		s/(^|[^a-zA-Z0-9])__packed([^a-zA-Z0-9_]|$)/\1__attribute__((packed))\2/g
		s/(^|[[:space:](])(inline|asm|volatile)([[:space:](]|$)/\1__\2__\3/g
		s@#(ifndef|define|endif[[:space:]]*/[*])[[:space:]]*_UAPI@#\1 @
	' "$K7SRC/include/uapi/$h" > "$B/usr/include/$h"
done

# 4. Compile. Sources = all *.c in the selftest dir except the standalone
#    utility (Makefile: kublk depends on $(filter-out metadata_size.c, *.c)).
#    Flags follow the selftest Makefile + lib.mk: -O3 -Wall -D_GNU_SOURCE -I usr/include, -lpthread -lm -luring.
log "compiling kublk (static)"
chroot "$ROOT" sh -ec '
	cd /build/kublk/src
	SRCS=$(ls *.c | grep -vx metadata_size.c | tr "\n" " ")
	echo "sources: $SRCS" >&2
	gcc --version | head -1 >&2
	gcc -O3 -Wall -D_GNU_SOURCE -static -I /build/kublk/usr/include -o /build/kublk/kublk $SRCS \
		-luring -lpthread -lm
'

mkdir -p "$(dirname "$OUT")"
install -m 0755 "$B/kublk" "$OUT"
log "built $OUT"
file "$OUT" >&2 || true
echo "$OUT"
