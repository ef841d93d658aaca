package bpf

// The eBPF objects and their Go bindings (*_bpfel.go, *_bpfeb.go and the
// .o files next to them) are generated and committed, so that building
// urnbd needs no clang. Regenerate with `go generate ./bpf` (or `make
// generate`) after changing a .bpf.c or .h file; tools/bpf-generate.sh
// checks that the committed files are current. Generation needs Debian's
// clang, llvm-strip and libbpf-dev (for <bpf/bpf_helpers.h>).

//go:generate go tool bpf2go -cc clang -strip llvm-strip -cflags "-O2 -Wall -Werror" -target bpfel,bpfeb -tags linux -output-stem block_lat -type blk_start -type blk_hist_key -type blk_sum_key -type blk_sum -type blk_cfg blockLat block_lat.bpf.c
//go:generate go tool bpf2go -cc clang -strip llvm-strip -cflags "-O2 -Wall -Werror" -target amd64,arm64 -tags linux -output-stem comp_cpu -type cq_cpu_key -type cq_cpu_val compCPU comp_cpu.bpf.c
