#!/usr/bin/env bash
# Installs what building and testing urnbd needs on a Debian 12 host, as
# root: Debian packages, and a Go toolchain from the Go module proxy when the
# machine has none new enough. Idempotent; prints the Go to use on stdout's
# last line as GO=/path/to/go.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
mkdir -p "$cache"

pkgs=(build-essential git curl ca-certificates unzip xz-utils kmod cpio
      qemu-system-x86 busybox-static fio util-linux iproute2
      rdma-core ibverbs-utils rdmacm-utils perftest nvme-cli librdmacm-dev libibverbs-dev
      bpftool dwarves nbdkit vagrant e2fsprogs bc clang llvm libbpf-dev
      lintian man-db zsh nbd-server nbd-client)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  if [ "$(id -u)" != 0 ]; then echo "deps: run as root to install packages" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# Go: the version go.mod asks for, from the module proxy's toolchain zips.
want=$(awk '/^go /{print $2}' "$root/go.mod")
have_go() { command -v "$1" >/dev/null 2>&1 && "$1" version 2>/dev/null | grep -q "go$want\b\|go$want "; }
go_bin=""
for g in go /usr/local/go/bin/go "$cache/go/go$want/bin/go"; do
  if have_go "$g"; then go_bin=$(command -v "$g"); break; fi
done
if [ -z "$go_bin" ]; then
  # A newer local Go will do too: it fetches the wanted toolchain itself.
  for g in go /usr/local/go/bin/go; do
    if command -v "$g" >/dev/null 2>&1; then go_bin=$(command -v "$g"); break; fi
  done
fi
if [ -z "$go_bin" ]; then
  zip="$cache/go/go$want.zip"
  mkdir -p "$cache/go"
  echo "deps: fetching Go $want from the module proxy" >&2
  curl -fsSL -o "$zip" "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$want.linux-amd64.zip"
  rm -rf "$cache/go/x" && mkdir -p "$cache/go/x"
  unzip -q "$zip" -d "$cache/go/x"
  mv "$cache/go/x/golang.org/toolchain@v0.0.1-go$want.linux-amd64" "$cache/go/go$want"
  rm -rf "$cache/go/x" "$zip"
  chmod +x "$cache/go/go$want/bin/"* "$cache/go/go$want/pkg/tool/"*/* 2>/dev/null || true
  go_bin="$cache/go/go$want/bin/go"
fi
echo "GO=$go_bin"
