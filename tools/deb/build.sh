#!/usr/bin/env bash
# Builds the Debian package of urnbd with dpkg-deb: the binary, its man
# pages and shell completions (generated from the command definitions by
# "urnbd gendocs"), the systemd units, defaults that export nothing, and
# ublk_drv in modules-load.d. Prints the .deb's path on its last line.
#
#   tools/deb/build.sh [OUTDIR]     (default .cache/deb)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-$root/.cache/deb}
GO=${GO:-$(bash tools/deps.sh | sed -n 's/^GO=//p')}
arch=$(dpkg --print-architecture)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# 0.1.0~gitDATE.COMMIT: ordered by commit date, below a 0.1.0 release.
date=$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null || date -u +%Y%m%d)
version=${URNBD_DEB_VERSION:-0.1.0~git$date.$commit}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/urnbd

install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" \
  "$pkg/usr/share/man/man1" "$pkg/usr/share/bash-completion/completions" \
  "$pkg/usr/share/zsh/vendor-completions" "$pkg/usr/share/doc/urnbd" \
  "$pkg/etc/default" "$pkg/etc/urnbd" "$pkg/usr/lib/modules-load.d"

CGO_ENABLED=1 "$GO" build -trimpath -buildvcs=false -buildmode=pie \
  -ldflags "-s -w -X main.releaseVersion=$version -X main.releaseCommit=$commit" \
  -o "$pkg/usr/bin/urnbd" ./cmd/urnbd
"$pkg/usr/bin/urnbd" gendocs "$stage/docs"
for m in "$stage"/docs/man1/*.1; do gzip -9n <"$m" >"$pkg/usr/share/man/man1/${m##*/}.gz"; done
install -m 0644 "$stage/docs/completion/urnbd.bash" "$pkg/usr/share/bash-completion/completions/urnbd"
install -m 0644 "$stage/docs/completion/_urnbd" "$pkg/usr/share/zsh/vendor-completions/_urnbd"
for u in tools/systemd/*.service; do
  sed -e 's#/usr/local/bin/urnbd#/usr/bin/urnbd#g' \
      -e 's#^\# Install: .*#\# Installed by the urnbd package; settings in /etc/default/'"$(basename "$u" .service)"'.#' \
      -e '/^# \/usr\/local\/bin\/urnbd; settings/d' "$u" >"$pkg/lib/systemd/system/${u##*/}"
done
install -m 0644 tools/deb/default-urnbd-server "$pkg/etc/default/urnbd-server"
install -m 0644 tools/deb/default-urnbd-client "$pkg/etc/default/urnbd-client"
install -m 0644 tools/deb/policy.toml "$pkg/etc/urnbd/policy.toml"
echo ublk_drv >"$pkg/usr/lib/modules-load.d/urnbd.conf"
install -m 0644 tools/deb/copyright "$pkg/usr/share/doc/urnbd/copyright"
{
  echo "urnbd ($version) unstable; urgency=medium"
  echo
  echo "  * Built from commit $commit."
  echo
  echo " -- urnbd maintainers <maintainers@urnbd.invalid>  $(date -u -R -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)")"
} | gzip -9n >"$pkg/usr/share/doc/urnbd/changelog.gz"
find "$pkg/etc" -type f -printf '/etc/%P\n' | sort >"$pkg/DEBIAN/conffiles"

# The shared libraries the binary needs itself, as Debian package names
# (a merged /usr registers them under /usr/lib, ldd may say /lib).
depends=
needed=$(readelf -d "$pkg/usr/bin/urnbd" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
for lib in $(ldd "$pkg/usr/bin/urnbd" | awk -v n=" $(echo $needed) " 'index(n, " " $1 " ") && /=> \//{print $3}'); do
  p=$(dpkg-query -S "$lib" 2>/dev/null || dpkg-query -S "/usr$lib" 2>/dev/null || dpkg-query -S "$(readlink -f "$lib")" 2>/dev/null) ||
    { echo "deb: no package holds $lib" >&2; exit 1; }
  p=${p%%:*}
  [ "$p" = libc6 ] || depends="$depends, $p"
done
depends=$(tr ',' '\n' <<<"$depends" | sed 's/^ //' | grep . | sort -u | paste -sd, | sed 's/,/, /g')
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CTL
Package: urnbd
Version: $version
Architecture: $arch
Maintainer: urnbd maintainers <maintainers@urnbd.invalid>
Installed-Size: $size
Depends: libc6, ${depends}, kmod
Recommends: rdma-core
Suggests: fio
Section: admin
Priority: optional
Homepage: https://github.com/urnbd/urnbd
Description: userspace RNBD/RTRS network block device (client and server)
 urnbd maps block devices that live on a server as /dev/ublkbN on a
 client, over RTRS on RDMA (wire-compatible with the Linux kernel's
 rnbd/rtrs modules, both ways) or over TCP with optional TLS 1.3, and
 serves them from files or block devices. The client side uses the
 kernel's ublk driver (ublk_drv, loaded at boot by this package).
 .
 The server exports nothing until /etc/default/urnbd-server names what
 to listen on and which devices to export, and /etc/urnbd/policy.toml
 allows a client to open them.
CTL
(cd "$pkg" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
find "$pkg" -type d -exec chmod 0755 {} +
mkdir -p "$out"
deb="$out/urnbd_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"
