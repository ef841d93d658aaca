package rtrs

import (
	"sync/atomic"
	"testing"
	"time"
)

func BenchmarkStatsRecordRead(b *testing.B) {
	s := NewClientPathStats(8)
	b.ReportAllocs()
	for b.Loop() {
		s.RecordRead(3, 4128)
	}
}

func BenchmarkStatsRecordSGEntries(b *testing.B) {
	s := NewClientPathStats(8)
	b.ReportAllocs()
	for b.Loop() {
		s.RecordSGEntries(3, 9)
	}
}

func BenchmarkStatsInflightIncDec(b *testing.B) {
	s := NewClientPathStats(8)
	b.ReportAllocs()
	for b.Loop() {
		s.IncInflight()
		s.DecInflight()
	}
}

func BenchmarkStatsRecordCompletion(b *testing.B) {
	s := NewClientPathStats(8)
	b.Run("same-cpu", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.RecordCompletion(3, 3)
		}
	})
	b.Run("migrated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.RecordCompletion(3, 4)
		}
	})
}

func BenchmarkStatsRecordPoll(b *testing.B) {
	s := NewClientPathStats(8)
	b.ReportAllocs()
	for b.Loop() {
		s.RecordPoll(3, 7)
	}
}

func BenchmarkStatsRecordLatency(b *testing.B) {
	s := NewClientPathStats(8)
	b.ReportAllocs()
	for b.Loop() {
		s.RecordReadLatency(3, 27*time.Microsecond)
	}
}

func BenchmarkStatsServerRecordWrite(b *testing.B) {
	s := NewServerPathStats(8)
	b.ReportAllocs()
	for b.Loop() {
		s.RecordWrite(3, 4128)
	}
}

// The per-I/O set a client queue thread does (submit + complete), each
// goroutine on its own CPU slot as pinned queue threads would be.
func BenchmarkStatsPerIOParallel(b *testing.B) {
	s := NewClientPathStats(StatsPossibleCPUs())
	var next atomic.Int32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		cpu := int(next.Add(1) - 1)
		for pb.Next() {
			s.IncInflight()
			s.RecordRead(cpu, 4128)
			s.RecordSGEntries(cpu, 1)
			s.RecordCompletion(cpu, cpu)
			s.RecordReadLatency(cpu, 27*time.Microsecond)
			s.DecInflight()
		}
	})
}

func BenchmarkStatsFormatRdma(b *testing.B) {
	s := NewClientPathStats(8)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = s.AppendRdma(buf[:0])
	}
}
