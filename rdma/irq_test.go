package rdma

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCompletionIRQs(t *testing.T) {
	sys, proc := fakeSysfs(t), t.TempDir()
	write := func(root, rel, data string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(sys, "class/infiniband/mlx5_0/device/msi_irqs/45", "msix\n")
	write(sys, "class/infiniband/mlx5_0/device/msi_irqs/44", "msix\n")
	write(proc, "interrupts", ""+
		"            CPU0       CPU1       \n"+
		"   0:         36          0   IO-APIC    2-edge      timer\n"+
		"  44:          7          0   IR-PCI-MSI 524288-edge      mlx5_async0@pci:0000:3b:00.0\n"+
		"  45:          0     123456   IR-PCI-MSI 524289-edge      mlx5_comp0@pci:0000:3b:00.0\n"+
		" NMI:          0          0   Non-maskable interrupts\n")
	write(proc, "irq/45/smp_affinity_list", "1\n")
	write(proc, "irq/45/effective_affinity_list", "1\n")
	write(proc, "irq/44/smp_affinity_list", "0-1\n")

	got, err := completionIRQsAt(sys, proc, "mlx5_0")
	if err != nil {
		t.Fatal(err)
	}
	if got.Software || len(got.IRQs) != 2 {
		t.Fatalf("mlx5_0: %+v, want two hardware IRQs", got)
	}
	comp := got.IRQs[1]
	if comp.Num != 45 || comp.Name != "mlx5_comp0@pci:0000:3b:00.0" || comp.Affinity != "1" || comp.Effective != "1" ||
		!slices.Equal(comp.PerCPU, []uint64{0, 123456}) {
		t.Errorf("IRQ 45: %+v", comp)
	}
	if got.IRQs[0].Num != 44 || got.IRQs[0].Effective != "" {
		t.Errorf("IRQ 44: %+v", got.IRQs[0])
	}

	rxe, err := completionIRQsAt(sys, proc, "rxe0")
	if err != nil {
		t.Fatal(err)
	}
	if !rxe.Software || len(rxe.IRQs) != 0 {
		t.Errorf("rxe0: %+v, want a software device without IRQs", rxe)
	}
	if _, err := completionIRQsAt(sys, proc, "nosuch0"); err == nil {
		t.Error("unknown device: no error")
	}
}
