#!/usr/bin/env bash
# Checks a built urnbd package on this machine, as root: lintian without
# errors; "apt-get install ./DEB"; the installed binary's --version, one
# man page per command that matches the binary's own, "man urnbd-map",
# the completions, systemd-analyze verify on the installed units; then
# purge, after which none of its files is left.
#
#   tools/deb/check.sh DEB
set -euo pipefail
deb=$(readlink -f "$1")
export DEBIAN_FRONTEND=noninteractive
need=()
for p in lintian man-db; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
fail() { echo "deb check: $*" >&2; exit 1; }

echo "lintian:"
lintian --tag-display-limit 0 "$deb" | tee /tmp/urnbd-lintian.txt || true
! grep -q '^E:' /tmp/urnbd-lintian.txt || fail "lintian reports errors"

dpkg -s urnbd >/dev/null 2>&1 && fail "urnbd is installed already: this check installs and purges its own"
apt-get install -y -q "$deb" >/dev/null
trap 'apt-get purge -y -q urnbd >/dev/null 2>&1 || true' EXIT

v=$(/usr/bin/urnbd --version)
echo "$v"
want=$(dpkg-deb -f "$deb" Version)
grep -q "^urnbd $want (commit [0-9a-f]\{12\}" <<<"$v" || fail "--version does not name the package's version $want and its commit: $v"
grep -q "^protocols: RTRS [0-9]\+\.[0-9]\+, RNBD [0-9]\+\.[0-9]\+$" <<<"$v" || fail "--version does not give the protocol versions"
/usr/bin/urnbd version --format json | python3 -c 'import json,sys; v=json.load(sys.stdin); assert v["version"] and v["rtrs_protocol"] and v["rnbd_protocol"] and "ublk_used_features" in v, v' ||
  fail "version --format json does not parse"

# Every command has its installed page, the same as the binary writes.
gen=$(mktemp -d)
/usr/bin/urnbd gendocs "$gen"
n=0
for m in "$gen"/man1/*.1; do
  page=/usr/share/man/man1/${m##*/}.gz
  [ -f "$page" ] || fail "no man page $page"
  cmp -s <(gunzip -c "$page") "$m" || fail "$page differs from what the binary documents"
  n=$((n + 1))
done
rm -rf "$gen"
man -P cat urnbd-map 2>/dev/null | grep -q "sessname=NAME" || fail "man urnbd-map does not show the map syntax"
echo "man pages: $n, all current"
bash -c 'source /usr/share/bash-completion/completions/urnbd && COMP_WORDS=(urnbd ma) COMP_CWORD=1 && _urnbd && [ "${COMPREPLY[*]}" = map ]' ||
  fail "the bash completion does not complete 'urnbd ma' to map"
[ -s /usr/share/zsh/vendor-completions/_urnbd ] || fail "no zsh completion"
SYSTEMD_LOG_LEVEL=warning systemd-analyze verify /lib/systemd/system/urnbd-server.service /lib/systemd/system/urnbd-client.service ||
  fail "systemd-analyze verify refuses the installed units"
grep -qx ublk_drv /usr/lib/modules-load.d/urnbd.conf || fail "ublk_drv is not loaded at boot"
# The default configuration exports nothing: the server refuses to start.
set +e
out=$(. /etc/default/urnbd-server; /usr/bin/urnbd server $URNBD_LISTEN --dev-search-path "$URNBD_DEV_SEARCH_PATH" $URNBD_SERVER_OPTS 2>&1)
rc=$?
set -e
[ $rc = 2 ] || fail "the server with the default settings exited $rc, want 2 (nothing to listen on or export): $out"
echo "server with the default settings: status 2: $out"

files=$(dpkg-query -L urnbd | while read -r f; do [ -f "$f" ] && echo "$f"; done)
apt-get purge -y -q urnbd >/dev/null
trap - EXIT
for f in $files; do [ ! -e "$f" ] || fail "$f is left after purge"; done
[ ! -e /etc/urnbd ] || fail "/etc/urnbd is left after purge"
echo "installed, checked and purged: $(wc -l <<<"$files") files, none left"
