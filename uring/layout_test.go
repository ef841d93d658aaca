package uring

import (
	"testing"
	"unsafe"
)

// Offsets and sizes from <linux/io_uring.h> (6.12), as reported by offsetof
// and sizeof in a C program compiled against the header.
func TestSQELayout(t *testing.T) {
	var s SQE
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"opcode", unsafe.Offsetof(s.Opcode), 0},
		{"flags", unsafe.Offsetof(s.Flags), 1},
		{"ioprio", unsafe.Offsetof(s.IoPrio), 2},
		{"fd", unsafe.Offsetof(s.Fd), 4},
		{"off/cmd_op", unsafe.Offsetof(s.Off), 8},
		{"addr", unsafe.Offsetof(s.Addr), 16},
		{"len", unsafe.Offsetof(s.Len), 24},
		{"rw_flags", unsafe.Offsetof(s.OpFlags), 28},
		{"user_data", unsafe.Offsetof(s.UserData), 32},
		{"buf_index", unsafe.Offsetof(s.BufIndex), 40},
		{"personality", unsafe.Offsetof(s.Personality), 42},
		{"splice_fd_in", unsafe.Offsetof(s.SpliceFdIn), 44},
		{"addr3/cmd", unsafe.Offsetof(s.Addr3), 48},
		{"sizeof(io_uring_sqe)", unsafe.Sizeof(s), 64},
		{"sizeof SQE128", unsafe.Sizeof(SQE128{}), 128},
		{"SQE128.SQE", unsafe.Offsetof(SQE128{}.SQE), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("SQE %s: offset/size %d, header says %d", c.name, c.got, c.want)
		}
	}

	var big SQE128
	cmd := big.Cmd()
	if off := uintptr(unsafe.Pointer(cmd)) - uintptr(unsafe.Pointer(&big)); off != 48 {
		t.Errorf("Cmd() at offset %d, want 48", off)
	}
	if len(cmd) != 80 || 48+len(cmd) != int(unsafe.Sizeof(big)) {
		t.Errorf("Cmd() is %d bytes, want 80 ending at 128", len(cmd))
	}
	if unsafe.Pointer(big.Cmd16()) != unsafe.Pointer(cmd) {
		t.Errorf("Cmd16() does not start at Cmd()")
	}
	if off := uintptr(unsafe.Pointer(s.Cmd16())) - uintptr(unsafe.Pointer(&s)); off != 48 {
		t.Errorf("Cmd16() at offset %d, want 48", off)
	}
}

func TestSetCmdOp(t *testing.T) {
	var s SQE
	s.Off = ^uint64(0)
	s.SetCmdOp(0xc0de1234)
	b := (*[64]byte)(unsafe.Pointer(&s))
	if got := *(*uint32)(unsafe.Pointer(&b[8])); got != 0xc0de1234 {
		t.Errorf("cmd_op at offset 8 = %#x, want 0xc0de1234", got)
	}
	if got := *(*uint32)(unsafe.Pointer(&b[12])); got != 0 {
		t.Errorf("__pad1 at offset 12 = %#x, want 0", got)
	}
	if s.CmdOp() != 0xc0de1234 {
		t.Errorf("CmdOp() = %#x", s.CmdOp())
	}

	s.PrepUringCmd(3, 0xabcd, 9)
	if got := *(*uint32)(unsafe.Pointer(&b[8])); got != 0xabcd || s.CmdOp() != 0xabcd {
		t.Errorf("PrepUringCmd: cmd_op = %#x, want 0xabcd", got)
	}
	if s.Opcode != OpUringCmd || s.Fd != 3 || s.UserData != 9 {
		t.Errorf("PrepUringCmd: %+v", s)
	}
}

func TestCQELayout(t *testing.T) {
	var c CQE
	var c32 CQE32
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"user_data", unsafe.Offsetof(c.UserData), 0},
		{"res", unsafe.Offsetof(c.Res), 8},
		{"flags", unsafe.Offsetof(c.Flags), 12},
		{"sizeof(io_uring_cqe)", unsafe.Sizeof(c), 16},
		{"big_cqe", unsafe.Offsetof(c32.big), 16},
		{"sizeof CQE32", unsafe.Sizeof(c32), 32},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("CQE %s: offset/size %d, header says %d", c.name, c.got, c.want)
		}
	}
}

func TestParamsLayout(t *testing.T) {
	var p Params
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"sq_entries", unsafe.Offsetof(p.SQEntries), 0},
		{"cq_entries", unsafe.Offsetof(p.CQEntries), 4},
		{"flags", unsafe.Offsetof(p.Flags), 8},
		{"sq_thread_cpu", unsafe.Offsetof(p.SQThreadCPU), 12},
		{"sq_thread_idle", unsafe.Offsetof(p.SQThreadIdle), 16},
		{"features", unsafe.Offsetof(p.Features), 20},
		{"wq_fd", unsafe.Offsetof(p.WQFd), 24},
		{"resv", unsafe.Offsetof(p.Resv), 28},
		{"sq_off", unsafe.Offsetof(p.SQOff), 40},
		{"cq_off", unsafe.Offsetof(p.CQOff), 80},
		{"sizeof(io_uring_params)", unsafe.Sizeof(p), 120},

		{"sq_off.head", unsafe.Offsetof(p.SQOff.Head), 0},
		{"sq_off.tail", unsafe.Offsetof(p.SQOff.Tail), 4},
		{"sq_off.ring_mask", unsafe.Offsetof(p.SQOff.RingMask), 8},
		{"sq_off.ring_entries", unsafe.Offsetof(p.SQOff.RingEntries), 12},
		{"sq_off.flags", unsafe.Offsetof(p.SQOff.Flags), 16},
		{"sq_off.dropped", unsafe.Offsetof(p.SQOff.Dropped), 20},
		{"sq_off.array", unsafe.Offsetof(p.SQOff.Array), 24},
		{"sq_off.resv1", unsafe.Offsetof(p.SQOff.Resv1), 28},
		{"sq_off.user_addr", unsafe.Offsetof(p.SQOff.UserAddr), 32},
		{"sizeof(io_sqring_offsets)", unsafe.Sizeof(p.SQOff), 40},

		{"cq_off.head", unsafe.Offsetof(p.CQOff.Head), 0},
		{"cq_off.tail", unsafe.Offsetof(p.CQOff.Tail), 4},
		{"cq_off.ring_mask", unsafe.Offsetof(p.CQOff.RingMask), 8},
		{"cq_off.ring_entries", unsafe.Offsetof(p.CQOff.RingEntries), 12},
		{"cq_off.overflow", unsafe.Offsetof(p.CQOff.Overflow), 16},
		{"cq_off.cqes", unsafe.Offsetof(p.CQOff.CQEs), 20},
		{"cq_off.flags", unsafe.Offsetof(p.CQOff.Flags), 24},
		{"cq_off.resv1", unsafe.Offsetof(p.CQOff.Resv1), 28},
		{"cq_off.user_addr", unsafe.Offsetof(p.CQOff.UserAddr), 32},
		{"sizeof(io_cqring_offsets)", unsafe.Sizeof(p.CQOff), 40},

		{"sizeof(__kernel_timespec)", unsafe.Sizeof(KernelTimespec{}), 16},
		{"sizeof(io_uring_getevents_arg)", unsafe.Sizeof(getEventsArg{}), 24},
		{"sizeof(io_uring_probe_op)", unsafe.Sizeof(ProbeOp{}), 8},
		{"io_uring_probe.ops", unsafe.Offsetof(Probe{}.Ops), 16},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: offset/size %d, header says %d", c.name, c.got, c.want)
		}
	}
}
