#!/usr/bin/env bash
# tools/lab/provision.sh — prepare a lab machine for urnbd (run as root).
#
# Used inside the qemu lab guest (tools/lab/lab run) and by the Vagrantfile.
# Self-contained on purpose: Vagrant uploads this one file.
#
#   provision.sh modules   load ublk_drv null_blk rdma_rxe rdma_ucm ib_uverbs
#                          veth nbd loop (and crc32_generic where it exists)
#   provision.sh rdma      two veth pairs with soft-RoCE on each end:
#                            path 1: veth0 192.0.2.1/24   (rxe0) <-> veth1 192.0.2.2/24   (rxe1)
#                            path 2: veth2 198.51.100.1/24 (rxe2) <-> veth3 198.51.100.2/24 (rxe3)
#                          with policy routing, so traffic between the two
#                          addresses of a pair crosses the veth, not lo
#   provision.sh rnbd      load the kernel's rtrs-server rnbd-server rnbd-client
#                          (built by `tools/lab/lab build-rnbd`)
#   provision.sh vagrant server|client
#                          what each Vagrant VM runs: packages, Go, modules,
#                          rxe0 on the private network's NIC
#
# Module parameters come from LAB_ARGS_<MODULE> (module name upper-cased,
# '-' -> '_'), e.g. LAB_ARGS_NULL_BLK="nr_devices=1 memory_backed=1",
# LAB_ARGS_RTRS_SERVER="always_invalidate=N", LAB_ARGS_RNBD_SERVER=...,
# LAB_ARGS_RNBD_CLIENT=... (null_blk defaults to "nr_devices=1").
# All modes are idempotent.
set -euo pipefail

PROG=provision
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

# The lab's addresses (documentation ranges, never routed anywhere).
PATH1=(veth0 192.0.2.1 veth1 192.0.2.2 rxe0 rxe1)
PATH2=(veth2 198.51.100.1 veth3 198.51.100.2 rxe2 rxe3)

# ------------------------------------------------------------------ modules

# modargs MODULE: prints LAB_ARGS_<MODULE>, or the default for MODULE.
modargs() {
	local var
	var=LAB_ARGS_$(printf '%s' "$1" | tr 'a-z-' 'A-Z_')
	if [[ -v $var ]]; then
		printf '%s' "${!var}"
	elif [[ $1 == null_blk ]]; then
		printf 'nr_devices=1'
	fi
}

is_loaded() { [[ -d /sys/module/${1//-/_} ]]; }

# load MODULE...: modprobe each with its parameters; fail on error. Modules
# without parameters go in one modprobe call (process start-up is slow under
# emulation).
load() {
	local m var args plain=()
	for m in "$@"; do
		read -ra args <<<"$(modargs "$m")"
		if is_loaded "$m"; then
			var=LAB_ARGS_$(printf '%s' "$m" | tr 'a-z-' 'A-Z_')
			[[ ! -v $var ]] || ((${#args[@]} == 0)) ||
				log "$m already loaded, not applying $var: ${args[*]}"
			continue
		fi
		if ((${#args[@]} == 0)); then
			plain+=("$m")
		else
			modprobe "$m" "${args[@]}" || die "modprobe $m ${args[*]} failed"
		fi
	done
	if ((${#plain[@]})); then
		modprobe -a "${plain[@]}" || die "modprobe -a ${plain[*]} failed"
	fi
}

# try_load MODULE...: like load, but only warn on failure.
try_load() {
	local m
	for m in "$@"; do
		(load "$m") || warn "could not load $m"
	done
}

MODULES=(ublk_drv null_blk rdma_rxe rdma_ucm ib_uverbs veth nbd loop)
RDMA_MODULES=(rdma_rxe rdma_ucm ib_uverbs)
# 6.12's rxe computes its ICRC through the crypto API's crc32, which needs
# crc32_generic; 7.x has no such module (rxe uses the crc32 library).
if modinfo crc32_generic >/dev/null 2>&1; then
	MODULES+=(crc32_generic)
	RDMA_MODULES+=(crc32_generic)
fi

do_modules() {
	load "${MODULES[@]}"
	log "loaded: ${MODULES[*]}"
}

# --------------------------------------------------------------------- rdma

# sysctl_set PATH VALUE (PATH relative to /proc/sys).
sysctl_set() {
	[[ -e /proc/sys/$1 ]] || return 0
	printf '%s\n' "$2" >"/proc/sys/$1"
}

# rule_add PREF RULE...: add an ip rule at PREF unless one is there.
rule_add() {
	local pref=$1
	shift
	[[ -n $(ip -4 rule show pref "$pref") ]] && return
	ip -4 rule add pref "$pref" "$@"
}

mac_of() { cat "/sys/class/net/$1/address"; }

# rxe_for NETDEV: prints the name of the rxe device on NETDEV, if any.
rxe_for() {
	rdma link show 2>/dev/null | awk -v nd="$1" '
		{ for (i = 1; i < NF; i++) if ($i == "netdev" && $(i + 1) == nd) { split($2, a, "/"); print a[1]; exit } }'
}

# add_rxe NAME NETDEV: soft-RoCE device NAME on NETDEV (once).
add_rxe() {
	local have
	have=$(rxe_for "$2")
	if [[ -n $have ]]; then
		[[ $have == "$1" ]] || warn "$2 already has rxe device $have (wanted $1)"
		return
	fi
	rdma link add "$1" type rxe netdev "$2" ||
		die "rdma link add $1 type rxe netdev $2 failed (is crc32_generic loaded?)"
}

# wait_active NAME...: wait until each rxe port is ACTIVE.
wait_active() {
	local n i
	for n in "$@"; do
		for ((i = 0; i < 100; i++)); do
			rdma link show "$n/1" 2>/dev/null | grep -q 'state ACTIVE' && continue 2
			sleep 0.1
		done
		rdma link show "$n/1" >&2 || true
		die "$n did not become ACTIVE"
	done
}

# setup_pair IF_A IP_A IF_B IP_B RXE_A RXE_B TABLE PREF: a veth pair whose
# traffic between IP_A and IP_B really crosses the pair (see LAB.md).
setup_pair() {
	local a=$1 aip=$2 b=$3 bip=$4 ra=$5 rb=$6 table=$7 pref=$8 i
	if ! ip link show dev "$a" >/dev/null 2>&1; then
		ip link add "$a" type veth peer name "$b"
	fi
	for i in "$a" "$b"; do
		sysctl_set "net/ipv6/conf/$i/disable_ipv6" 1
		sysctl_set "net/ipv4/conf/$i/accept_local" 1
		sysctl_set "net/ipv4/conf/$i/rp_filter" 0
	done
	ip addr replace "$aip/24" dev "$a"
	ip addr replace "$bip/24" dev "$b"
	ip link set "$a" up
	ip link set "$b" up
	# Locally generated A->B leaves through A's veth, and B->A through B's.
	ip route replace "$bip/32" dev "$a" src "$aip" table "$table"
	ip route replace "$aip/32" dev "$b" src "$bip" table "$((table + 1))"
	rule_add "$pref" iif lo from "$aip" to "$bip" lookup "$table"
	rule_add "$((pref + 1))" iif lo from "$bip" to "$aip" lookup "$((table + 1))"
	# No ARP for addresses that are local on both sides.
	ip neigh replace "$bip" lladdr "$(mac_of "$b")" dev "$a" nud permanent
	ip neigh replace "$aip" lladdr "$(mac_of "$a")" dev "$b" nud permanent
	add_rxe "$ra" "$a"
	add_rxe "$rb" "$b"
}

do_rdma() {
	load veth "${RDMA_MODULES[@]}"
	sysctl_set net/ipv4/conf/all/accept_local 1
	sysctl_set net/ipv4/conf/all/rp_filter 0
	sysctl_set net/ipv4/conf/default/rp_filter 0
	setup_pair "${PATH1[@]}" 100 10
	setup_pair "${PATH2[@]}" 102 12
	# The local table after the rules above (it is normally at pref 0).
	rule_add 1000 lookup local
	if ip -4 rule show pref 0 | grep -q 'lookup local'; then
		ip -4 rule del pref 0 lookup local
	fi
	wait_active "${PATH1[4]}" "${PATH1[5]}" "${PATH2[4]}" "${PATH2[5]}"
	log "rdma paths: ${PATH1[4]} ${PATH1[1]} <-> ${PATH1[5]} ${PATH1[3]}, ${PATH2[4]} ${PATH2[1]} <-> ${PATH2[5]} ${PATH2[3]}"
	rdma link
}

# --------------------------------------------------------------------- rnbd

do_rnbd() {
	local m
	for m in rtrs-server rnbd-server rnbd-client; do
		if ! is_loaded "$m" && ! modinfo -n "$m" >/dev/null 2>&1; then
			die "module $m not found for kernel $(uname -r); run 'tools/lab/lab build-rnbd' on the host first"
		fi
	done
	load "${RDMA_MODULES[@]}" rtrs-server rnbd-server rtrs-client rnbd-client
	log "loaded: rtrs-server rnbd-server rnbd-client"
}

# ------------------------------------------------------------------ vagrant

VAGRANT_PACKAGES=(rdma-core ibverbs-utils ibverbs-providers rdmacm-utils
	perftest fio iproute2 kmod build-essential pkg-config libibverbs-dev
	librdmacm-dev git curl ca-certificates bpftool)

install_packages() {
	local p missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
			missing+=("$p")
	done
	((${#missing[@]})) || return 0
	log "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# install_go GOMOD: the Go toolchain go.mod asks for, from go.dev, into
# /usr/local/go (Debian's golang is too old). Only warns on failure.
install_go() {
	local gomod=$1 want have url tmp
	[[ -f $gomod ]] || { warn "no $gomod, not installing Go"; return 0; }
	want=$(awk '$1 == "toolchain" { sub(/^go/, "", $2); print $2; exit }' "$gomod")
	[[ -n $want ]] || want=$(awk '$1 == "go" { print $2; exit }' "$gomod")
	[[ -n $want ]] || { warn "no go version in $gomod"; return 0; }
	have=$(/usr/local/go/bin/go env GOVERSION 2>/dev/null || true)
	[[ $have == "go$want" ]] && return 0
	url=https://go.dev/dl/go$want.linux-amd64.tar.gz
	log "installing Go $want from $url"
	tmp=$(mktemp)
	if curl -fsSL -o "$tmp" "$url"; then
		rm -rf /usr/local/go
		tar -C /usr/local -xzf "$tmp"
		# shellcheck disable=SC2016 # expanded at login
		printf 'export PATH=$PATH:/usr/local/go/bin\n' >/etc/profile.d/go.sh
	else
		warn "could not download $url; build urnbd on the host instead"
	fi
	rm -f "$tmp"
}

# private_netdev IP: the interface that carries IP.
private_netdev() {
	ip -o -4 addr show | awk -v ip="$1" '{ split($4, a, "/"); if (a[1] == ip) { print $2; exit } }'
}

do_vagrant() {
	local role=${1:-}
	[[ $role == server || $role == client ]] || die "usage: provision.sh vagrant server|client"
	local ip=${LAB_PRIVATE_IP:-} dev
	install_packages "${VAGRANT_PACKAGES[@]}"
	install_go "${LAB_SRC:-/vagrant}/go.mod"
	# The box's own kernel: load what it has (rtrs/rnbd are not built by Debian).
	try_load "${MODULES[@]}"
	printf '%s\n' "${MODULES[@]}" >/etc/modules-load.d/urnbd-lab.conf
	printf 'options null_blk %s\n' "$(modargs null_blk)" >/etc/modprobe.d/urnbd-lab.conf
	if [[ -z $ip ]]; then
		ip=$(ip -o -4 addr show | awk '$4 ~ /^192\.168\.56\./ { split($4, a, "/"); print a[1]; exit }')
	fi
	[[ -n $ip ]] || die "cannot find the private network address (set LAB_PRIVATE_IP)"
	dev=$(private_netdev "$ip")
	[[ -n $dev ]] || die "no interface has $ip"
	add_rxe rxe0 "$dev"
	wait_active "$(rxe_for "$dev")"
	if [[ -n ${LAB_SERVER_IP:-} && -n ${LAB_CLIENT_IP:-} ]]; then
		sed -i '/ # urnbd-lab$/d' /etc/hosts
		printf '%s server # urnbd-lab\n%s client # urnbd-lab\n' \
			"$LAB_SERVER_IP" "$LAB_CLIENT_IP" >>/etc/hosts
	fi
	log "$role ready: rxe0 on $dev ($ip)"
	rdma link
}

# --------------------------------------------------------------------- main

main() {
	[[ $EUID -eq 0 ]] || die "must run as root"
	export PATH=$PATH:/usr/sbin:/sbin
	case ${1:-} in
	modules) do_modules ;;
	rdma) do_rdma ;;
	rnbd) do_rnbd ;;
	vagrant) shift; do_vagrant "$@" ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
	*) die "usage: provision.sh modules|rdma|rnbd|vagrant server|client" ;;
	esac
}

main "$@"
