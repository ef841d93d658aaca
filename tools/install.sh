#!/usr/bin/env bash
# Installs urnbd without a package (make install): the binary, its man
# pages and completions, and the systemd units, under PREFIX (default
# /usr/local) inside DESTDIR; units go to DESTDIR/etc/systemd/system.
# Remove with the list it prints to PREFIX/share/urnbd/installed-files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
prefix=${PREFIX:-/usr/local}
dest=${DESTDIR:-}
GO=${GO:-$(bash tools/deps.sh | sed -n 's/^GO=//p')}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
"$GO" build -trimpath -buildvcs=false -buildmode=pie \
  -ldflags "-X main.releaseCommit=$commit" -o "$tmp/urnbd" ./cmd/urnbd
"$tmp/urnbd" gendocs "$tmp/docs"
files=()
put() { # put MODE SRC DST
  install -D -m "$1" "$2" "$dest$3"
  files+=("$3")
}
put 0755 "$tmp/urnbd" "$prefix/bin/urnbd"
for m in "$tmp"/docs/man1/*.1; do put 0644 "$m" "$prefix/share/man/man1/${m##*/}"; done
put 0644 "$tmp/docs/completion/urnbd.bash" "$prefix/share/bash-completion/completions/urnbd"
put 0644 "$tmp/docs/completion/_urnbd" "$prefix/share/zsh/site-functions/_urnbd"
for u in tools/systemd/*.service; do
  sed "s#/usr/local/bin/urnbd#$prefix/bin/urnbd#g" "$u" >"$tmp/${u##*/}"
  put 0644 "$tmp/${u##*/}" "/etc/systemd/system/${u##*/}"
done
install -d "$dest$prefix/share/urnbd"
printf '%s\n' "${files[@]}" "$prefix/share/urnbd/installed-files" >"$dest$prefix/share/urnbd/installed-files"
echo "installed ${#files[@]} files under ${dest:-/}; list in $prefix/share/urnbd/installed-files"
