#!/usr/bin/env bash
# make bench: Go benchmarks with -benchmem on the host, then the ublk
# benchmarks in the lab VM (fio against the kernel's own devices, and the
# allocation benchmark of the queue loop), RNBD over soft-RoCE against the
# kernel's RNBD and NVMe-oF (rnbd-lab.sh), and the link's ceiling (perftest)
# next to urnbd's RTRS over RDMA (rdma-ceiling.sh), and the cost of the eBPF
# tracing (trace-overhead.sh); then block devices over TCP: urnbd against
# the kernel's NVMe/TCP and NBD (tcp-lab.sh). The lab part runs on both lab
# kernels. Results: .cache/bench/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
GO=$(bash tools/deps.sh | sed -n 's/^GO=//p')
PATH="$(dirname "$GO"):$PATH"
export PATH
mkdir -p .cache/bench .cache/lab/bin
echo "== Go benchmarks (host)"
go test -run '^$' -bench . -benchmem ./uring ./rtrs/... ./rnbd | tee .cache/bench/host.txt
echo "== RTRS over TCP (loopback) vs nbdkit memory + fio nbd"
GO="$GO" tools/bench/rtrs-tcp.sh
echo "== ublk in the lab"
go build -o .cache/lab/bin/urnbd ./cmd/urnbd
go test -c -o .cache/lab/bin/ublk.test ./ublk
go build -o .cache/lab/bin/rtrsbench ./tools/rtrsbench
cat > .cache/lab/bench-guest.sh <<'EOS'
#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../.."
modprobe ublk_drv
(cd ublk && ../.cache/lab/bin/ublk.test -test.run '^$' -test.bench 'BenchmarkLab' -test.benchmem) | tee "$LAB_OUT/ublk-gobench.txt"
tools/bench/ublk-lab.sh
tools/bench/rnbd-lab.sh
tools/bench/rdma-ceiling.sh
tools/bench/trace-overhead.sh
EOS
chmod +x .cache/lab/bench-guest.sh
# Each lab kernel (URNBD_LAB_KERNELS picks), the TCP comparison in a boot
# of its own (it needs null_blk with its own device count).
# The kernel's own ublk server beside urnbd's, built once from 7.3's source
# (which build-rnbd of the 7.x kernel downloads).
URNBD_KUBLK=$(LAB_KERNEL=7 tools/lab/lab build-rnbd >/dev/null && tools/bench/build-kublk.sh | tail -1)
export URNBD_KUBLK
for k in ${URNBD_LAB_KERNELS:-6.12 7}; do
  export LAB_KERNEL=$k
  tools/lab/lab build-rnbd
  out=.cache/bench/lab-$k-$(date +%Y%m%d-%H%M%S)
  URNBD_BIN="$root/.cache/lab/bin/urnbd" tools/lab/lab run --out "$out" -- .cache/lab/bench-guest.sh
  URNBD_BIN="$root/.cache/lab/bin/urnbd" tools/lab/lab run --out "$out-tcp" -- tools/bench/tcp-lab.sh
  echo "results for Linux $k in $out and $out-tcp"
done
