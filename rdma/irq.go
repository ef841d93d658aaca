package rdma

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Completion interrupts. A hardware RDMA device raises one MSI-X interrupt
// per completion vector; the CPU it lands on runs the CQ's completion
// handler, which wakes the thread waiting on the CQ's completion channel.
// RTRS wants that CPU to be the one the queue's thread runs on. Software
// devices (rxe, siw) have no interrupts of their own: their completions
// are raised from the context that processed the packet (the network
// softirq, or the driver's work item).

// IRQ is an interrupt of an RDMA device and where it may run.
type IRQ struct {
	Num  int    `json:"irq"`
	Name string `json:"name"` // the action name in /proc/interrupts, e.g. "mlx5_comp3@pci:0000:3b:00.0"
	// Affinity is the CPU list the interrupt may be delivered to
	// (/proc/irq/N/smp_affinity_list), Effective the one the kernel
	// chose (effective_affinity_list; empty where the kernel does not
	// report it).
	Affinity  string `json:"smp_affinity_list"`
	Effective string `json:"effective_affinity_list,omitempty"`
	// PerCPU is the interrupt's count on each CPU, as /proc/interrupts
	// shows it.
	PerCPU []uint64 `json:"per_cpu"`
}

// DeviceIRQs describes the interrupts of one RDMA device.
type DeviceIRQs struct {
	Device string `json:"device"`
	// Software is set for devices without interrupts of their own (rxe,
	// siw), found by their "parent" netdev attribute and the absence of
	// MSI interrupts.
	Software bool  `json:"software"`
	IRQs     []IRQ `json:"irqs"`
}

// CompletionIRQs returns the interrupts of the RDMA device named dev (its
// PCI function's MSI/MSI-X interrupts, listed in sysfs under
// device/msi_irqs), with their affinity and counts. A software device has
// none.
func CompletionIRQs(dev string) (DeviceIRQs, error) {
	return completionIRQsAt(SysfsRoot, "/proc", dev)
}

func completionIRQsAt(sysRoot, procRoot, dev string) (DeviceIRQs, error) {
	out := DeviceIRQs{Device: dev}
	dir := filepath.Join(sysRoot, "class", "infiniband", dev)
	if _, err := os.Stat(dir); err != nil {
		return out, fmt.Errorf("rdma: device %s: %w", dev, err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "device", "msi_irqs"))
	if errors.Is(err, fs.ErrNotExist) {
		out.Software = readAttr(filepath.Join(dir, "parent")) != ""
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("rdma: device %s: %w", dev, err)
	}
	var nums []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			nums = append(nums, n)
		}
	}
	slices.Sort(nums)
	table, err := readInterrupts(filepath.Join(procRoot, "interrupts"))
	if err != nil {
		return out, err
	}
	for _, n := range nums {
		irq := table[n]
		irq.Num = n
		irqDir := filepath.Join(procRoot, "irq", strconv.Itoa(n))
		irq.Affinity = readAttr(filepath.Join(irqDir, "smp_affinity_list"))
		irq.Effective = readAttr(filepath.Join(irqDir, "effective_affinity_list"))
		out.IRQs = append(out.IRQs, irq)
	}
	return out, nil
}

// readInterrupts parses /proc/interrupts: a header of CPU names, then one
// line per interrupt, "N: count... chip hwirq-type name[, name...]".
func readInterrupts(path string) (map[int]IRQ, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rdma: read interrupts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		return nil, fmt.Errorf("rdma: %s: no header", path)
	}
	ncpu := len(strings.Fields(sc.Text()))
	out := map[int]IRQ{}
	for sc.Scan() {
		label, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(label))
		if err != nil {
			continue // NMI, LOC and other architecture rows
		}
		fields := strings.Fields(rest)
		irq := IRQ{Num: n}
		for i := 0; i < ncpu && i < len(fields); i++ {
			v, err := strconv.ParseUint(fields[i], 10, 64)
			if err != nil {
				break
			}
			irq.PerCPU = append(irq.PerCPU, v)
		}
		// After the counts: chip, hwirq-and-type, then the action names.
		if tail := fields[len(irq.PerCPU):]; len(tail) > 2 {
			irq.Name = strings.Join(tail[2:], " ")
		}
		out[n] = irq
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("rdma: read interrupts: %w", err)
	}
	return out, nil
}
