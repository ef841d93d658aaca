//go:build linux

package bpf

import (
	"io"

	"github.com/urnbd/urnbd/rtrs"
)

// CQCount is the number of completions of one CQ on one CPU.
type CQCount struct {
	UserHandle uint64 `json:"user_handle"` // the process's struct ibv_cq address
	CPU        int    `json:"cpu"`
	CompVector uint32 `json:"comp_vector"`
	Count      uint64 `json:"count"`
}

// Migration computes RTRS's cpu_migration from counts: expected gives
// the CPU each CQ's completions should land on (the CPU of the queue
// that polls it); CQs it does not know are left out. A completion of a
// CQ expected on CPU e that landed on CPU c != e counts in from[e] and
// to[c]. Both slices have ncpu entries; CPUs beyond are left out.
func Migration(counts []CQCount, ncpu int, expected func(userHandle uint64) (cpu int, ok bool)) (from, to []uint64) {
	from, to = make([]uint64, ncpu), make([]uint64, ncpu)
	for _, c := range counts {
		e, ok := expected(c.UserHandle)
		if !ok || e == c.CPU || e < 0 || e >= ncpu || c.CPU < 0 || c.CPU >= ncpu {
			continue
		}
		from[e] += c.Count
		to[c.CPU] += c.Count
	}
	return from, to
}

// FormatCPUMigration writes from and to as RTRS's 5.6 cpu_migration
// table ("    CPU0 CPU1 ...", "from: ...", "to  : ...").
func FormatCPUMigration(w io.Writer, from, to []uint64) error {
	s := rtrs.ClientStatsSnapshot{MigrationFrom: from, MigrationTo: to}
	_, err := w.Write(s.AppendCPUMigration(nil))
	return err
}
