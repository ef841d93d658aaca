package uring

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestSQE128(t *testing.T) {
	r := newRing(t, 4, SetupSQE128)
	if !r.SQE128() {
		t.Fatal("SQE128() = false")
	}
	sqe := r.GetSQE128()
	base := uintptr(unsafe.Pointer(sqe))
	cmd := sqe.Cmd()
	if off := uintptr(unsafe.Pointer(cmd)) - base; off != 48 || len(cmd) != 80 {
		t.Fatalf("Cmd() = %d bytes at offset %d, want 80 at 48", len(cmd), off)
	}
	// The entries are 128 bytes apart.
	entry := (*[128]byte)(unsafe.Pointer(sqe))
	for i := range entry {
		entry[i] = 0xff
	}
	sqe.PrepNop(1) // rewrites bytes 0..63 only
	if entry[63] != 0 || entry[64] != 0xff || entry[127] != 0xff {
		t.Fatalf("PrepNop touched the wrong bytes: % x", entry[56:72])
	}
	next := r.GetSQE()
	if d := uintptr(unsafe.Pointer(next)) - base; d != 128 {
		t.Fatalf("second SQE %d bytes after the first, want 128", d)
	}
	next.PrepNop(2)
	submitAll(t, r)
	reap(t, r, 2)

	// Go round the ring: the first slot comes back zeroed over 128 bytes.
	for i := range 2 {
		r.GetSQE().PrepNop(uint64(3 + i))
	}
	again := r.GetSQE128()
	if again != sqe {
		t.Fatal("ring of 4 did not wrap to the first slot")
	}
	if *entry != [128]byte{} {
		t.Errorf("GetSQE128 did not zero all 128 bytes: % x", entry[:])
	}
	again.PrepNop(5)
	submitAll(t, r)
	reap(t, r, 3)
}

func TestGetSQE128Panics(t *testing.T) {
	r := newRing(t, 4, 0)
	defer func() {
		if recover() == nil {
			t.Error("GetSQE128 on a 64-byte ring did not panic")
		}
	}()
	r.GetSQE128()
}

// A URING_CMD to a file whose driver has no ->uring_cmd fails at once with a
// negative errno; it must not hang.
func TestUringCmdUnsupported(t *testing.T) {
	f := tempFile(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])

	for _, tc := range []struct {
		name  string
		flags uint32
		fd    int
	}{
		{"SQE128/pipe", SetupSQE128, p[0]},
		{"SQE128/file", SetupSQE128, int(f.Fd())},
		{"SQE128+CQE32/pipe", SetupSQE128 | SetupCQE32, p[1]},
		{"SQE64/file", 0, int(f.Fd())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(t, 4, tc.flags)
			if r.SQE128() {
				sqe := r.GetSQE128()
				sqe.PrepUringCmd(int32(tc.fd), 0x12345678, 77)
				cmd := sqe.Cmd()
				for i := range cmd {
					cmd[i] = byte(i)
				}
				if sqe.CmdOp() != 0x12345678 {
					t.Fatalf("payload overwrote cmd_op: %#x", sqe.CmdOp())
				}
			} else {
				r.GetSQE().PrepUringCmd(int32(tc.fd), 0x12345678, 77)
			}
			submitAll(t, r)
			c := reap(t, r, 1)[0]
			if c.UserData != 77 || c.Res >= 0 {
				t.Fatalf("CQE %+v, want a negative errno", c)
			}
			switch c.Err() {
			case unix.EOPNOTSUPP, unix.EINVAL, unix.ENOTTY, unix.EBADF:
				t.Logf("URING_CMD failed with %s", errnoName(c.Res))
			default:
				t.Errorf("URING_CMD failed with unexpected %s", errnoName(c.Res))
			}
		})
	}
}

func TestCQE32(t *testing.T) {
	r := newRing(t, 4, SetupCQE32)
	if !r.CQE32() || r.CQEntries() != 8 {
		t.Fatalf("CQE32() %v, CQEntries %d", r.CQE32(), r.CQEntries())
	}
	// Three rounds of 4 cover every slot of the 8-entry CQ and wrap.
	for round := range 3 {
		for i := range 4 {
			r.GetSQE().PrepNop(uint64(round*10 + i))
		}
		if _, err := r.SubmitAndWait(4); err != nil {
			t.Fatal(err)
		}
		switch round {
		case 0: // PeekCQE32 / CQESeen, checking the stride
			var prev uintptr
			for i := range 4 {
				c := r.PeekCQE32()
				if c == nil || c.UserData != uint64(i) || c.Res != 0 || c.Big() != [2]uint64{} {
					t.Fatalf("CQE %d = %+v", i, c)
				}
				if p := uintptr(unsafe.Pointer(c)); i > 0 && p-prev != 32 {
					t.Fatalf("CQE %d is %d bytes after the previous, want 32", i, p-prev)
				}
				prev = uintptr(unsafe.Pointer(c))
				r.CQESeen()
			}
		case 1: // ForEachCQE32
			i := 0
			n := r.ForEachCQE32(func(c *CQE32) {
				if c.UserData != uint64(10+i) || c.Big() != [2]uint64{} {
					t.Errorf("CQE %d = %+v", i, *c)
				}
				i++
			})
			if n != 4 {
				t.Errorf("ForEachCQE32 = %d", n)
			}
		case 2: // the 16-byte view strides 32 bytes too
			i := 0
			r.ForEachCQE(func(c *CQE) {
				if c.UserData != uint64(20+i) {
					t.Errorf("CQE %d = %+v", i, *c)
				}
				i++
			})
			if i != 4 {
				t.Errorf("ForEachCQE reaped %d", i)
			}
		}
	}
}

func TestCQE32Panics(t *testing.T) {
	r := newRing(t, 4, 0)
	defer func() {
		if recover() == nil {
			t.Error("PeekCQE32 on a 16-byte CQ ring did not panic")
		}
	}()
	r.PeekCQE32()
}
