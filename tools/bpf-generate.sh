#!/usr/bin/env bash
# tools/bpf-generate.sh — check that the committed eBPF objects and Go
# bindings in bpf/ are those its sources generate (for CI).
#
# Runs each `//go:generate` line of bpf/gen.go with bpf2go's output going to
# a temporary directory, then compares every generated file (*_bpfel.go,
# *_bpfeb.go and their .o) with the committed one. Exits 1 and names the
# files that differ, are missing or are left over. Regenerate with
# `go generate ./bpf` (or `make generate`).
#
# Generation is deterministic for a given compiler: bpf2go strips DWARF
# and maps source paths; the objects depend on clang's version, so use the
# same Debian clang as the committed files (clang --version is printed).
# Needs: clang, llvm-strip, libbpf-dev (<bpf/bpf_helpers.h>), go.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/bpf"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

clang --version | head -n1
export GOPACKAGE=bpf GOFILE=gen.go
grep '^//go:generate ' gen.go | sed 's|^//go:generate ||' | while IFS= read -r cmd; do
	# Put -output-dir right after the bpf2go command.
	cmd=${cmd/tool bpf2go /tool bpf2go -output-dir $tmp }
	eval "$cmd"
done

status=0
shopt -s nullglob
for f in "$tmp"/*; do
	name=${f##*/}
	if [[ ! -e $name ]]; then
		echo "bpf/$name: missing (not generated into the tree)"
		status=1
	elif ! cmp -s "$f" "$name"; then
		echo "bpf/$name: stale (differs from what its sources generate)"
		status=1
	fi
done
for f in *_bpfel.go *_bpfeb.go *_bpfel.o *_bpfeb.o; do
	if [[ ! -e $tmp/$f ]]; then
		echo "bpf/$f: left over (no go:generate line produces it)"
		status=1
	fi
done
if ((status)); then
	echo "run: go generate ./bpf" >&2
else
	echo "bpf: generated files are current"
fi
exit "$status"
