#!/usr/bin/env bash
# The lab demo (README's first command), as root on Debian 12: installs what
# it needs, builds urnbd, boots the lab kernel under qemu and, inside:
#   1. soft-RoCE on two paths (two veth pairs, an rxe on each end);
#   2. urnbd server exporting a file, urnbd map over both soft-RoCE paths
#      (RTRS over RDMA), fio verify, urnbd list and urnbd stats;
#   3. the kernel's RNBD (our interoperability peer) mapping a null_blk over
#      both soft-RoCE paths: fio, and the RTRS statistics of each path;
# then shuts the VM down. Output of the run also lands in .cache/lab/out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
GO=$(bash tools/deps.sh | sed -n 's/^GO=//p')
mkdir -p .cache/lab/bin
"$GO" build -o .cache/lab/bin/urnbd ./cmd/urnbd
tools/lab/lab build-rnbd
URNBD_BIN="$root/.cache/lab/bin/urnbd" tools/lab/lab run -- tools/demo/guest.sh
