#!/usr/bin/env bash
# tools/lab/validate-vagrant.sh — checks the repository's Vagrantfile without
# network access or a hypervisor: `vagrant validate` with the default
# provider, again with provider config ignored (as on a host without
# VirtualBox or vagrant-libvirt), and that the VMs are provisioned by
# tools/lab/provision.sh. Vagrant's state folder goes to .cache/lab/vagrant,
# not the work tree.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)
cd "$ROOT"

say() { printf 'validate-vagrant: %s\n' "$*"; }
fail() { printf 'validate-vagrant: FAIL: %s\n' "$*" >&2; exit 1; }

command -v vagrant >/dev/null || fail "vagrant is not installed (apt-get install vagrant)"
[[ -f Vagrantfile ]] || fail "no Vagrantfile in $ROOT"

export VAGRANT_DOTFILE_PATH=$ROOT/.cache/lab/vagrant
export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_BOX_UPDATE_CHECK_DISABLE=1

# With no hypervisor at all (a container), Vagrant has no default provider
# and says so; the provider-independent check below still runs then.
if ! out=$(vagrant validate 2>&1); then
	if grep -q 'No usable default provider' <<<"$out"; then
		say "no usable default provider on this host (no VirtualBox, libvirt or docker): provider-independent check only"
	else
		printf '%s\n' "$out" >&2
		fail "vagrant validate (default provider)"
	fi
else
	printf '%s\n' "$out"
fi
VAGRANT_DEFAULT_PROVIDER=virtualbox vagrant validate --ignore-provider ||
	fail "vagrant validate --ignore-provider"
grep -q 'path: "tools/lab/provision.sh"' Vagrantfile ||
	fail "the Vagrantfile does not provision with tools/lab/provision.sh"
for role in server client; do
	grep -q "\"$role\"" Vagrantfile || fail "the Vagrantfile defines no $role VM"
done
say "ok"
