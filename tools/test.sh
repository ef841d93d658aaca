#!/usr/bin/env bash
# The whole test suite: lint, host tests (unit, race, short fuzzing), then
# the lab for everything that needs a real ublk/RDMA kernel, on each lab
# kernel (6.12 and 7.x; URNBD_LAB_KERNELS="6.12" for one). This is
# what `make test` and CI run. Prints "N passed, N failed" at the end.
#
#   tools/test.sh           everything
#   tools/test.sh host      lint and host tests only
#   tools/test.sh lab       lab tests only
#   tools/test.sh lint      gofmt, go vet, staticcheck
#   tools/test.sh fuzz      every fuzz target for URNBD_FUZZTIME (default 60s)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
what=${1:-all}
GO=$(bash tools/deps.sh | sed -n 's/^GO=//p')
export PATH="$(dirname "$GO"):$root/.cache/bin:$PATH"
export GOFLAGS=${GOFLAGS:-}
passed=0 failed=0 failures=()
step() { # step NAME CMD...: run a step, count it, keep going
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name"
  if "$@"; then
    passed=$((passed + 1)); echo "--- ok   $name ($((SECONDS - t0))s)"
  else
    failed=$((failed + 1)); failures+=("$name"); echo "--- FAIL $name ($((SECONDS - t0))s)"
  fi
}

lint() {
  local bad
  bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
  [ -z "$bad" ] || { echo "gofmt would change: $bad"; return 1; }
  go vet ./... || return 1
  if [ ! -x .cache/bin/staticcheck ]; then
    GOBIN="$root/.cache/bin" go install honnef.co/go/tools/cmd/staticcheck@v0.8.2 || return 1
  fi
  .cache/bin/staticcheck ./... || return 1
  tools/bpf-generate.sh || return 1 # the committed eBPF objects match their sources
  systemd_verify
}

systemd_verify() { # the units parse, with the binary they start in place
  command -v systemd-analyze >/dev/null || { echo "lint: systemd-analyze missing (apt-get install systemd)"; return 1; }
  local dir=.cache/systemd-verify
  rm -rf "$dir" && mkdir -p "$dir"
  go build -o "$dir/urnbd" ./cmd/urnbd
  for u in tools/systemd/*.service; do
    sed "s#/usr/local/bin/urnbd#$root/$dir/urnbd#g" "$u" >"$dir/${u##*/}"
  done
  SYSTEMD_LOG_LEVEL=warning systemd-analyze verify "$dir"/*.service
}

fuzz_short() { # every Fuzz target, 50000 inputs each (or URNBD_FUZZTIME)
  local pkg f
  for pkg in $(go list ./...); do
    for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
      echo "fuzz $pkg $f"
      # Go's fuzzing coordinator sometimes ends a short run with "context
      # deadline exceeded" on a loaded machine (no input failed): try once
      # more; a real crash fails both times.
      go test -run '^$' -fuzz "^$f\$" -fuzztime "${URNBD_FUZZTIME:-50000x}" "$pkg" ||
        go test -run '^$' -fuzz "^$f\$" -fuzztime "${URNBD_FUZZTIME:-50000x}" "$pkg" || return 1
    done
  done
}

deb_check() { # the Debian package builds, passes lintian, installs, purges
  local deb
  rm -f .cache/deb/urnbd_*.deb
  deb=$(GO=$GO tools/deb/build.sh | tail -1)
  tools/deb/check.sh "$deb"
}

lab_build() {
  mkdir -p .cache/lab/bin
  rm -f .cache/lab/bin/*.test .cache/lab/bin/tests.txt
  # The lab runs the binary of the Debian package: what users install.
  local deb x
  deb=$(GO=$GO tools/deb/build.sh | tail -1)
  x=$(mktemp -d)
  dpkg-deb -x "$deb" "$x"
  cp "$x/usr/bin/urnbd" .cache/lab/bin/urnbd
  rm -rf "$x"
  rm -f .cache/lab/bin/tests.txt.tmp
  local pkg dir rel name
  for pkg in $(go list ./...); do
    dir=$(go list -f '{{.Dir}}' "$pkg")
    if grep -qs 'func TestLab' "$dir"/*_test.go; then
      rel=${dir#"$root"/}
      name=${rel//\//_}
      go test -c -o ".cache/lab/bin/$name.test" "$pkg"
      # go-tests.sh runs each binary from its package folder.
      printf '%s %s\n' "$name.test" "$rel" >>.cache/lab/bin/tests.txt.tmp
    fi
  done
  # The end-to-end tests last: one of them takes a soft-RoCE link down.
  { grep -v '^internal_e2e' .cache/lab/bin/tests.txt.tmp; grep '^internal_e2e' .cache/lab/bin/tests.txt.tmp; } >.cache/lab/bin/tests.txt
  rm -f .cache/lab/bin/tests.txt.tmp
}

# lab_run TIMEOUT TEST...: one lab boot running the lab tests TEST... .
# Under qemu's TCG the kernel's own code patching now and then oopses on an
# int3 at a patch site (a static key switched, e.g. a tracepoint that a
# probe enables, while the other vCPU runs past it): a boot that ends in
# such an oops is run once more, saying so. Any other failure, and a second
# oops, fails.
lab_run() {
  local timeout=$1 out try
  shift
  mkdir -p "$root/.cache/lab/out"
  for try in 1 2; do
    out=$(mktemp -d "$root/.cache/lab/out/suite-XXXXXX")
    URNBD_BIN="$root/.cache/lab/bin/urnbd" tools/lab/lab run --timeout "$timeout" --out "$out" -- \
      tools/lab/tests/run-all.sh "$@" && return 0
    if [[ $try == 2 ]] || ! grep -q 'Oops: int3' "$out/console.log" 2>/dev/null; then
      return 1
    fi
    echo "lab: the guest kernel oopsed on an int3 (TCG code patching; console: $out/console.log); running the same tests again" >&2
  done
}

lab_suite() { # lab_suite KERNEL: the whole lab suite on lab kernel KERNEL
  local rc=0
  export LAB_KERNEL=$1
  tools/lab/lab build-rnbd || return 1
  lab_run 2400 kernel-rnbd-smoke.sh rdma-smoke.sh rnbd-interop.sh go-tests.sh daemon-kill-rdma.sh || rc=1
  # A boot of its own: it leaves a soft-RoCE pair unusable.
  lab_run 600 veth-down.sh || rc=1
  return $rc
}

case $what in
  lint) step lint lint ;;
  fuzz) URNBD_FUZZTIME=${URNBD_FUZZTIME:-60s} step fuzz fuzz_short ;;
esac
if [ "$what" = all ] || [ "$what" = host ]; then
  step lint lint
  step "go test -race (host)" go test -race -count=1 ./...
  # The RSS test says nothing under the race detector's shadow memory.
  step "go test (host, memory returned)" go test -count=1 -run '^TestHostileSessionsReturnMemory$' ./rtrs/tcp
  step "fuzz (short)" fuzz_short
  step "vagrant validate" tools/lab/validate-vagrant.sh
  step "Debian package (lintian, install, check, purge)" deb_check
fi
if [ "$what" = all ] || [ "$what" = lab ]; then
  step "build lab binaries" lab_build
  # Both lab kernels (URNBD_LAB_KERNELS picks): Debian 12's 6.12 and
  # Debian 13 backports' 7.x.
  for k in ${URNBD_LAB_KERNELS:-6.12 7}; do
    step "lab suite on Linux $k (ublk, kernel RNBD, soft-RoCE)" lab_suite "$k"
  done
fi
echo
((failed == 0)) || printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
