#!/usr/bin/env bash
# Kills the urnbd client daemon with SIGKILL under heavy fio on a device
# mapped over RDMA (two rxe paths), URNBD_ROUNDS times (default 6): the
# daemon must exit within 60 s, a new daemon (started by `urnbd list`) must
# recover the device, and fio must end without errors. Fails at the first
# round that does not.
#
# Why: with its completion CPU probe attached by fentry, a killed daemon
# sometimes never exited (once in a 6-round run of this load, once in a
# lab suite run): releasing the probe's BPF trampoline waited in
# synchronize_rcu_tasks for good. The probe is a kprobe now. A hang
# prints the stuck threads' kernel stacks.
#
# Needs the lab (tools/lab/lab run) and URNBD_BIN (default
# .cache/lab/bin/urnbd). Not verified I/O: TestLabCLIClientDaemonDies
# checks data across a daemon's death; this one is about exiting.
set -uo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
bin=${URNBD_BIN:-$root/.cache/lab/bin/urnbd}
rounds=${URNBD_ROUNDS:-6}
port=1261
work=$(mktemp -d)
export URNBD_RUN_DIR=$work/run
"$root/tools/lab/provision.sh" modules >/dev/null
"$root/tools/lab/provision.sh" rdma >/dev/null
command -v fio >/dev/null || { echo "daemon-kill-rdma: fio missing" >&2; exit 1; }
mkdir -p "$work/img" "$URNBD_RUN_DIR"
truncate -s 256M "$work/img/a.img"

"$bin" server --listen "rdma://192.0.2.2:$port" --listen "rdma://198.51.100.2:$port" \
	--dev-search-path "$work/img" 2>"$work/server.log" &
server=$!
dev=''
cleanup() {
	[[ -n $dev ]] && "$bin" unmap --force "$dev" >/dev/null 2>&1
	[[ -f $URNBD_RUN_DIR/client.pid ]] && kill "$(cat "$URNBD_RUN_DIR/client.pid")" 2>/dev/null
	kill "$server" 2>/dev/null
	wait "$server" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "daemon-kill-rdma: round $r: $*" >&2; exit 1; }

for r in $(seq 1 "$rounds"); do
	dev=''
	for _ in $(seq 1 30); do # the server may still be starting, or hold the last round's session
		if out=$("$bin" map "sessname=kill$r" transport=rdma "dest_port=$port" \
			path=ip:192.0.2.1@ip:192.0.2.2 path=ip:198.51.100.1@ip:198.51.100.2 device_path=a.img 2>&1); then
			dev=$out
			break
		fi
		sleep 1
	done
	[[ -n $dev ]] || fail "map: $out"
	fio --name=kill --filename="$dev" --rw=randrw --bssplit=4k/50:64k/25:1m/25 --numjobs=2 \
		--iodepth=64 --ioengine=libaio --direct=1 --time_based --runtime=25 --size=200M \
		--output-format=terse >"$work/fio.out" 2>&1 &
	fio=$!
	sleep 6
	kill -0 "$fio" 2>/dev/null || fail "fio ended before the kill: $(cat "$work/fio.out")"
	pid=$(cat "$URNBD_RUN_DIR/client.pid")
	t0=$SECONDS
	kill -9 "$pid"
	while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < 60)); do sleep 1; done
	if kill -0 "$pid" 2>/dev/null; then
		for t in /proc/"$pid"/task/*; do
			echo "== thread ${t##*/} $(cat "$t/comm"), state $(cut -d' ' -f3 "$t/stat")"
			cat "$t/stack"
		done
		fail "the daemon (pid $pid) is alive 60 s after SIGKILL"
	fi
	exited=$((SECONDS - t0))
	recovered=0
	for _ in $(seq 1 60); do
		if "$bin" list 2>/dev/null | grep -q " open "; then recovered=1; break; fi
		sleep 2
	done
	((recovered)) || fail "not recovered within 2 minutes: $("$bin" list 2>&1)"
	wait "$fio"
	rc=$?
	# terse v3: field 5 is the job's error number
	errs=$(awk -F';' '{ s += $5 } END { print s + 0 }' "$work/fio.out")
	((rc == 0 && errs == 0)) || fail "fio: status $rc, errors $errs: $(cat "$work/fio.out")"
	"$bin" unmap --force "$dev" >/dev/null || fail "unmap $dev"
	dev=''
	echo "daemon-kill-rdma: round $r: the daemon exited ${exited}s after SIGKILL, the device was recovered, fio ended without errors"
done
