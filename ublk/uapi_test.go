package ublk

import (
	"testing"
	"unsafe"
)

func TestLayoutSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"ublksrv_ctrl_cmd", unsafe.Sizeof(CtrlCmd{}), sizeofCtrlCmd},
		{"ublksrv_ctrl_dev_info", unsafe.Sizeof(DevInfo{}), sizeofDevInfo},
		{"ublksrv_io_desc", unsafe.Sizeof(IODesc{}), sizeofIODesc},
		{"ublksrv_io_cmd", unsafe.Sizeof(IOCmd{}), sizeofIOCmd},
		{"ublk_params", unsafe.Sizeof(Params{}), sizeofParams},
		{"ublk_param_basic", unsafe.Sizeof(ParamBasic{}), 32},
		{"ublk_param_discard", unsafe.Sizeof(ParamDiscard{}), 20},
		{"ublk_batch_io", unsafe.Sizeof(BatchCmd{}), 16},
		{"ublk_elem_header", unsafe.Sizeof(ElemHeader{}), 8},
	} {
		if c.got != c.want {
			t.Errorf("sizeof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestLayoutOffsets(t *testing.T) {
	var info DevInfo
	var p Params
	var cmd CtrlCmd
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"ctrl_cmd.addr", unsafe.Offsetof(cmd.Addr), 8},
		{"ctrl_cmd.data", unsafe.Offsetof(cmd.Data), 16},
		{"ctrl_cmd.dev_path_len", unsafe.Offsetof(cmd.DevPathLen), 24},
		{"dev_info.max_io_buf_bytes", unsafe.Offsetof(info.MaxIOBufBytes), 8},
		{"dev_info.dev_id", unsafe.Offsetof(info.DevID), 12},
		{"dev_info.ublksrv_pid", unsafe.Offsetof(info.ServerPID), 16},
		{"dev_info.flags", unsafe.Offsetof(info.Flags), 24},
		{"dev_info.owner_uid", unsafe.Offsetof(info.OwnerUID), 40},
		{"params.basic", unsafe.Offsetof(p.Basic), 8},
		{"params.basic.dev_sectors", unsafe.Offsetof(p.Basic) + unsafe.Offsetof(p.Basic.DevSectors), 24},
		{"params.discard", unsafe.Offsetof(p.Discard), 40},
		{"params.devt", unsafe.Offsetof(p.Devt), 60},
		{"params.zoned", unsafe.Offsetof(p.Zoned), 76},
	} {
		if c.got != c.want {
			t.Errorf("offsetof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// The ioctl-encoded opcodes, as the C macros of ublk_cmd.h expand them on
// x86_64 (computed by hand from _IOR/_IOWR with the struct sizes).
func TestOpcodes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"UBLK_U_CMD_GET_QUEUE_AFFINITY", opGetQueueAffinity, 0x80207501},
		{"UBLK_U_CMD_GET_DEV_INFO", opGetDevInfo, 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", opAddDev, 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", opDelDev, 0xc0207505},
		{"UBLK_U_CMD_START_DEV", opStartDev, 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", opStopDev, 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", opSetParams, 0xc0207508},
		{"UBLK_U_CMD_GET_PARAMS", opGetParams, 0x80207509},
		{"UBLK_U_CMD_START_USER_RECOVERY", opStartUserRecovery, 0xc0207510},
		{"UBLK_U_CMD_END_USER_RECOVERY", opEndUserRecovery, 0xc0207511},
		{"UBLK_U_CMD_GET_FEATURES", opGetFeatures, 0x80207513},
		{"UBLK_U_CMD_DEL_DEV_ASYNC", opDelDevAsync, 0x80207514},
		{"UBLK_U_IO_FETCH_REQ", opFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", opCommitAndFetchReq, 0xc0107521},
		{"UBLK_U_IO_PREP_IO_CMDS", opPrepIOCmds, 0xc0107525},
		{"UBLK_U_IO_COMMIT_IO_CMDS", opCommitIOCmds, 0xc0107526},
		{"UBLK_U_IO_FETCH_IO_CMDS", opFetchIOCmds, 0xc0107527},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

// A public Go implementation mapped queue 0 for every queue; the stride is
// fixed by the maximum depth, not the configured one.
func TestDescriptorArea(t *testing.T) {
	const page = 4096
	for _, c := range []struct {
		q, depth int
		off      int64
		length   int
	}{
		{0, 128, 0, 4096},
		{1, 128, 98304, 4096},
		{3, 1, 3 * 98304, 4096},
		{2, 4096, 2 * 98304, 98304},
		{1, 171, 98304, 8192},
	} {
		if got := descAreaOffset(c.q, page); got != c.off {
			t.Errorf("descAreaOffset(%d) = %d, want %d", c.q, got, c.off)
		}
		if got := descAreaLen(c.depth, page); got != c.length {
			t.Errorf("descAreaLen(%d) = %d, want %d", c.depth, got, c.length)
		}
	}
}

func TestOptionsParams(t *testing.T) {
	o := Options{Size: 1 << 30, LogicalBlockSize: 512, PhysicalBlockSize: 4096, Queues: 2,
		VolatileCache: true, FUA: true, MaxDiscardSectors: 1 << 20}
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	p := o.params()
	if p.Types != ParamTypeBasic|ParamTypeDiscard {
		t.Errorf("types = %#x", p.Types)
	}
	b := p.Basic
	if b.LogicalBSShift != 9 || b.PhysicalBSShift != 12 || b.DevSectors != 1<<21 ||
		b.MaxSectors != DefaultMaxIOBytes>>9 || b.Attrs != AttrVolatileCache|AttrFUA {
		t.Errorf("basic = %+v", b)
	}
	if p.Discard.MaxDiscardSegments != 1 || p.Discard.DiscardGranularity != 4096 {
		t.Errorf("discard = %+v", p.Discard)
	}
	if o.Depth != DefaultQueueDepth {
		t.Errorf("depth default = %d", o.Depth)
	}
}

func TestOptionsRejects(t *testing.T) {
	for _, o := range []Options{
		{Size: 0},
		{Size: 1000},
		{Size: 1 << 20, Depth: MaxQueueDepth + 1},
		{Size: 1 << 20, Queues: -1},
		{Size: 1 << 20, MaxIOBytes: 1000},
		{Size: 1 << 20, LogicalBlockSize: 1000},
		{Size: 1 << 20, LogicalBlockSize: 4096, PhysicalBlockSize: 512},
		{Size: 1 << 20, Queues: 1, Depth: 2, Buffers: make([]byte, 4096)},
	} {
		if err := o.setDefaults(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

func TestFeatureNames(t *testing.T) {
	got := FeatureNames(FlagUserRecovery | FlagCmdIoctlEncode | 1<<40)
	want := []string{"user_recovery", "cmd_ioctl_encode", "bit40"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// The 7.3 flags by name: each bit's name is the UAPI's UBLK_F_ name.
func TestFeatureNames73(t *testing.T) {
	for flag, want := range map[uint64]string{
		FlagUserRecoveryFailIO: "user_recovery_fail_io", FlagUpdateSize: "update_size",
		FlagAutoBufReg: "auto_buf_reg", FlagQuiesce: "quiesce", FlagPerIODaemon: "per_io_daemon",
		FlagBufRegOffDaemon: "buf_reg_off_daemon", FlagBatchIO: "batch_io", FlagIntegrity: "integrity",
		FlagSafeStopDev: "safe_stop_dev", FlagNoAutoPartScan: "no_auto_part_scan",
		FlagShmemZC: "shmem_zc", FlagIODescSize: "io_desc_size", 1 << 21: "bit21",
	} {
		if got := FeatureNames(flag); len(got) != 1 || got[0] != want {
			t.Errorf("FeatureNames(%#x) = %v, want [%s]", flag, got, want)
		}
	}
	if Wanted(0) != UsedFeatures || Wanted(^uint64(0)) != UsedFeatures|OptionalFeatures {
		t.Errorf("Wanted: %#x from nothing, %#x from everything", Wanted(0), Wanted(^uint64(0)))
	}
	if opTryStopDev != 0xC0207517 || opUpdateSize != 0xC0207515 || opQuiesceDev != 0xC0207516 {
		t.Errorf("TRY_STOP_DEV %#x, UPDATE_SIZE %#x, QUIESCE_DEV %#x", opTryStopDev, opUpdateSize, opQuiesceDev)
	}
}
