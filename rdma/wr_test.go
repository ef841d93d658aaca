package rdma

import (
	"errors"
	"testing"
)

func TestSendBatchBuild(t *testing.T) {
	b := NewSendBatch(2, 2)
	defer b.Free()
	if err := b.AddSGE(SGE{}); !errors.Is(err, ErrEmptyBatch) {
		t.Fatalf("AddSGE on empty batch: %v", err)
	}
	sg := SGE{Addr: 0x1000, Length: 512, LKey: 7}
	if err := b.Add(SendWR{ID: 1, Opcode: WRWriteWithImm, Flags: SendSignaled, Imm: 0x01020304, RemoteAddr: 0x9000, RKey: 9}, sg); err != nil {
		t.Fatal(err)
	}
	if err := b.AddSGE(SGE{Addr: 0x2000, Length: 8, LKey: 7}); err != nil {
		t.Fatal(err)
	}
	if err := b.AddSGE(SGE{}); !errors.Is(err, ErrTooManySGE) {
		t.Fatalf("third SGE: %v", err)
	}
	if err := b.Add(SendWR{ID: 2}, sg, sg, sg); !errors.Is(err, ErrTooManySGE) {
		t.Fatalf("three SGEs: %v", err)
	}
	if err := b.Add(SendWR{ID: 2, Opcode: WRSend}); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(SendWR{ID: 3}); !errors.Is(err, ErrBatchFull) {
		t.Fatalf("third WR: %v", err)
	}
	if b.Len() != 2 || b.Cap() != 2 {
		t.Fatalf("len %d cap %d", b.Len(), b.Cap())
	}
	w := b.in[0]
	if w.id != 1 || w.opcode != uint32(WRWriteWithImm) || w.flags != uint32(SendSignaled) ||
		w.imm != 0x01020304 || w.remoteAddr != 0x9000 || w.rkey != 9 || w.numSGE != 2 {
		t.Errorf("wr 0 %+v", w)
	}
	if b.sge[0] != sg || b.sge[1].Addr != 0x2000 || b.in[1].numSGE != 0 {
		t.Errorf("sges %+v", b.sge)
	}
	b.Reset()
	if b.Len() != 0 {
		t.Fatal("Reset left requests")
	}
	// Building a batch does not allocate.
	allocs := testing.AllocsPerRun(100, func() {
		b.Reset()
		_ = b.Add(SendWR{ID: 1, Opcode: WRSend}, sg)
		_ = b.AddSGE(sg)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per batch build", allocs)
	}
}

func TestRecvBatchBuild(t *testing.T) {
	b := NewRecvBatch(1, 1)
	defer b.Free()
	sg := SGE{Addr: 0x1000, Length: 512, LKey: 7}
	if err := b.Add(5, sg); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(6, sg); !errors.Is(err, ErrBatchFull) {
		t.Fatalf("second WR: %v", err)
	}
	if b.in[0].id != 5 || b.in[0].numSGE != 1 || b.sge[0] != sg {
		t.Errorf("wr %+v sge %+v", b.in[0], b.sge[0])
	}
}
