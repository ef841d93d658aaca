package ublk

import (
	"fmt"
	"unsafe"
)

// Control command numbers (_IOC_NR of the ioctl-encoded opcodes), from
// include/uapi/linux/ublk_cmd.h: up to DEL_DEV_ASYNC in Linux 6.12, the
// rest in 7.x (each needs the feature flag named beside it).
const (
	cmdGetQueueAffinity  = 0x01
	cmdGetDevInfo        = 0x02
	cmdAddDev            = 0x04
	cmdDelDev            = 0x05
	cmdStartDev          = 0x06
	cmdStopDev           = 0x07
	cmdSetParams         = 0x08
	cmdGetParams         = 0x09
	cmdStartUserRecovery = 0x10
	cmdEndUserRecovery   = 0x11
	cmdGetDevInfo2       = 0x12
	cmdGetFeatures       = 0x13
	cmdDelDevAsync       = 0x14
	cmdUpdateSize        = 0x15 // FlagUpdateSize
	cmdQuiesceDev        = 0x16 // FlagQuiesce
	cmdTryStopDev        = 0x17 // FlagSafeStopDev
)

// I/O command numbers: the per-tag protocol, and the batch protocol of
// FlagBatchIO (Linux 7.0), whose commands carry a BatchCmd instead of an
// IOCmd (both 16 bytes, so the encodings share ioOp).
const (
	ioFetchReq          = 0x20
	ioCommitAndFetchReq = 0x21
	ioNeedGetData       = 0x22
	ioPrepIOCmds        = 0x25
	ioCommitIOCmds      = 0x26
	ioFetchIOCmds       = 0x27
)

// ioctl direction bits of the asm-generic encoding used on x86 and arm64.
const (
	iocWrite = 1
	iocRead  = 2
)

// ioc builds an ioctl number: dir(2) size(14) type(8) nr(8).
func ioc(dir, typ, nr, size uint32) uint32 {
	return dir<<30 | size<<16 | typ<<8 | nr
}

func ctrlOp(dir, nr uint32) uint32 { return ioc(dir, 'u', nr, uint32(unsafe.Sizeof(CtrlCmd{}))) }
func ioOp(nr uint32) uint32        { return ioc(iocRead|iocWrite, 'u', nr, uint32(unsafe.Sizeof(IOCmd{}))) }

// Ioctl-encoded command opcodes (UBLK_U_CMD_* and UBLK_U_IO_*), carried in the
// cmd_op field of an IORING_OP_URING_CMD submission.
var (
	opGetQueueAffinity  = ctrlOp(iocRead, cmdGetQueueAffinity)
	opGetDevInfo        = ctrlOp(iocRead, cmdGetDevInfo)
	opAddDev            = ctrlOp(iocRead|iocWrite, cmdAddDev)
	opDelDev            = ctrlOp(iocRead|iocWrite, cmdDelDev)
	opStartDev          = ctrlOp(iocRead|iocWrite, cmdStartDev)
	opStopDev           = ctrlOp(iocRead|iocWrite, cmdStopDev)
	opSetParams         = ctrlOp(iocRead|iocWrite, cmdSetParams)
	opGetParams         = ctrlOp(iocRead, cmdGetParams)
	opStartUserRecovery = ctrlOp(iocRead|iocWrite, cmdStartUserRecovery)
	opEndUserRecovery   = ctrlOp(iocRead|iocWrite, cmdEndUserRecovery)
	opGetFeatures       = ctrlOp(iocRead, cmdGetFeatures)
	opDelDevAsync       = ctrlOp(iocRead, cmdDelDevAsync)
	opUpdateSize        = ctrlOp(iocRead|iocWrite, cmdUpdateSize)
	opQuiesceDev        = ctrlOp(iocRead|iocWrite, cmdQuiesceDev)
	opTryStopDev        = ctrlOp(iocRead|iocWrite, cmdTryStopDev)

	opFetchReq          = ioOp(ioFetchReq)
	opCommitAndFetchReq = ioOp(ioCommitAndFetchReq)
	opPrepIOCmds        = ioOp(ioPrepIOCmds)
	opCommitIOCmds      = ioOp(ioCommitIOCmds)
	opFetchIOCmds       = ioOp(ioFetchIOCmds)
)

// Results of a FETCH_REQ or COMMIT_AND_FETCH_REQ completion.
const (
	ioResOK          = 0
	ioResNeedGetData = 1
	// ioResAbort (-ENODEV) means the queue is being torn down: the tag is gone.
	ioResAbort = -19
)

// Feature flags (UBLK_F_*), negotiated at ADD_DEV: the kernel clears what it
// does not support and returns the result in DevInfo.Flags. Linux 6.12 has
// bits 0-8; the rest came in 6.13-7.3 (docs/ublk.md).
const (
	FlagSupportZeroCopy     uint64 = 1 << 0
	FlagURingCmdCompInTask  uint64 = 1 << 1
	FlagNeedGetData         uint64 = 1 << 2
	FlagUserRecovery        uint64 = 1 << 3
	FlagUserRecoveryReissue uint64 = 1 << 4
	FlagUnprivilegedDev     uint64 = 1 << 5
	FlagCmdIoctlEncode      uint64 = 1 << 6
	FlagUserCopy            uint64 = 1 << 7
	FlagZoned               uint64 = 1 << 8
	FlagUserRecoveryFailIO  uint64 = 1 << 9
	FlagUpdateSize          uint64 = 1 << 10
	FlagAutoBufReg          uint64 = 1 << 11
	FlagQuiesce             uint64 = 1 << 12
	FlagPerIODaemon         uint64 = 1 << 13
	FlagBufRegOffDaemon     uint64 = 1 << 14
	FlagBatchIO             uint64 = 1 << 15
	FlagIntegrity           uint64 = 1 << 16
	FlagSafeStopDev         uint64 = 1 << 17
	FlagNoAutoPartScan      uint64 = 1 << 18
	FlagShmemZC             uint64 = 1 << 19
	FlagIODescSize          uint64 = 1 << 20
)

// Device states reported in DevInfo.State.
const (
	StateDead     = 0
	StateLive     = 1
	StateQuiesced = 2
	StateFailIO   = 3 // 7.x: the server died and I/O fails until recovery
)

// MaxQueueDepth is the largest queue depth the kernel accepts
// (UBLK_MAX_QUEUE_DEPTH); it also fixes the stride of the descriptor areas in
// the char device's mmap space.
const MaxQueueDepth = 4096

// MaxQueues is the largest number of hardware queues (UBLK_MAX_NR_QUEUES).
const MaxQueues = 4096

// I/O operations (UBLK_IO_OP_*), the low 8 bits of IODesc.OpFlags.
const (
	OpRead        = 0
	OpWrite       = 1
	OpFlush       = 2
	OpDiscard     = 3
	OpWriteSame   = 4
	OpWriteZeroes = 5
)

// I/O flags (UBLK_IO_F_*), in IODesc.OpFlags above the op.
const (
	IOFlagFailfastDev       = 1 << 8
	IOFlagFailfastTransport = 1 << 9
	IOFlagFailfastDriver    = 1 << 10
	IOFlagMeta              = 1 << 11
	IOFlagFUA               = 1 << 13
	IOFlagNoUnmap           = 1 << 15
	IOFlagSwap              = 1 << 16
)

// Attributes of ParamBasic.Attrs (UBLK_ATTR_*).
const (
	AttrReadOnly      = 1 << 0
	AttrRotational    = 1 << 1
	AttrVolatileCache = 1 << 2
	AttrFUA           = 1 << 3
)

// Parameter types of Params.Types (UBLK_PARAM_TYPE_*).
const (
	ParamTypeBasic   = 1 << 0
	ParamTypeDiscard = 1 << 1
	ParamTypeDevt    = 1 << 2
	ParamTypeZoned   = 1 << 3
)

// CtrlCmd is struct ublksrv_ctrl_cmd: the 32-byte payload of a control
// command, at offset 48 of a 128-byte submission entry.
type CtrlCmd struct {
	DevID      uint32
	QueueID    uint16
	Len        uint16
	Addr       uint64
	Data       uint64
	DevPathLen uint16
	_          uint16
	_          uint32
}

// DevInfo is struct ublksrv_ctrl_dev_info (64 bytes).
type DevInfo struct {
	NrHWQueues    uint16
	QueueDepth    uint16
	State         uint16
	_             uint16
	MaxIOBufBytes uint32
	DevID         uint32
	ServerPID     int32
	_             uint32
	Flags         uint64
	ServerFlags   uint64
	OwnerUID      uint32
	OwnerGID      uint32
	_             uint64
	_             uint64
}

// IODesc is struct ublksrv_io_desc (24 bytes): one block request, as the
// kernel writes it into the queue's descriptor area for a tag.
type IODesc struct {
	OpFlags     uint32
	NrSectors   uint32
	StartSector uint64
	Addr        uint64
}

// Op returns the request's operation (OpRead, OpWrite, ...).
func (d *IODesc) Op() uint8 { return uint8(d.OpFlags) }

// IOCmd is struct ublksrv_io_cmd (16 bytes): the payload of FETCH_REQ and
// COMMIT_AND_FETCH_REQ, at offset 48 of a (64-byte) submission entry.
type IOCmd struct {
	QueueID uint16
	Tag     uint16
	Result  int32
	Addr    uint64
}

// BatchCmd is struct ublk_batch_io, the command area of PREP_IO_CMDS,
// COMMIT_IO_CMDS and FETCH_IO_CMDS. For PREP and COMMIT, sqe->addr points
// at NrElem elements of ElemBytes each; FETCH takes ElemBytes 2 (a tag) and
// no flags.
type BatchCmd struct {
	QueueID   uint16
	Flags     uint16 // batchHas*
	NrElem    uint16
	ElemBytes uint8
	_         uint8
	_         uint64
}

// batchHasBufAddr (UBLK_BATCH_F_HAS_BUF_ADDR): each element carries the
// address of the tag's buffer, as IOCmd.Addr does in the per-tag protocol.
// The copy mode that urnbd uses requires it in PREP and COMMIT.
const batchHasBufAddr = 1 << 1

// ElemHeader is struct ublk_elem_header: the start of each element of
// PREP_IO_CMDS and COMMIT_IO_CMDS. With batchHasBufAddr the address of the
// tag's buffer follows it (a uint64, as IOCmd.Addr in the per-tag protocol);
// with FlagAutoBufReg nothing does, and BufIndex is the fixed-buffer slot
// for the request's pages.
type ElemHeader struct {
	Tag      uint16
	BufIndex uint16
	Result   int32 // COMMIT only: as IOCmd.Result
}

// maxFetchTags is the most tags the driver puts in one FETCH_IO_CMDS
// completion.
const maxFetchTags = 128

// ParamBasic is struct ublk_param_basic.
type ParamBasic struct {
	Attrs            uint32
	LogicalBSShift   uint8
	PhysicalBSShift  uint8
	IOOptShift       uint8
	IOMinShift       uint8
	MaxSectors       uint32
	ChunkSectors     uint32
	DevSectors       uint64
	VirtBoundaryMask uint64
}

// ParamDiscard is struct ublk_param_discard.
type ParamDiscard struct {
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
	_                     uint16
}

// ParamDevt is struct ublk_param_devt, filled in by the kernel (read only).
type ParamDevt struct {
	CharMajor uint32
	CharMinor uint32
	DiskMajor uint32
	DiskMinor uint32
}

// ParamZoned is struct ublk_param_zoned.
type ParamZoned struct {
	MaxOpenZones         uint32
	MaxActiveZones       uint32
	MaxZoneAppendSectors uint32
	_                    [20]byte
}

// Params is struct ublk_params. Len must be the size of the struct and Types
// must say which members are meaningful.
type Params struct {
	Len     uint32
	Types   uint32
	Basic   ParamBasic
	Discard ParamDiscard
	Devt    ParamDevt
	Zoned   ParamZoned
}

// Sizes the kernel expects; checked by tests against the C layout.
const (
	sizeofCtrlCmd = 32
	sizeofDevInfo = 64
	sizeofIODesc  = 24
	sizeofIOCmd   = 16
	sizeofParams  = 112
)

// descAreaOffset is the mmap offset of queue q's descriptor area on the char
// device: the stride is computed with MaxQueueDepth, whatever the depth.
func descAreaOffset(q int, pageSize int) int64 {
	return int64(q) * int64(roundUp(MaxQueueDepth*sizeofIODesc, pageSize))
}

// descAreaLen is the length to map for a queue of the given depth.
func descAreaLen(depth int, pageSize int) int {
	return roundUp(depth*sizeofIODesc, pageSize)
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

var featureNames = []string{
	"zero_copy", "comp_in_task", "need_get_data", "user_recovery",
	"user_recovery_reissue", "unprivileged", "cmd_ioctl_encode", "user_copy",
	"zoned", "user_recovery_fail_io", "update_size", "auto_buf_reg",
	"quiesce", "per_io_daemon", "buf_reg_off_daemon", "batch_io", "integrity",
	"safe_stop_dev", "no_auto_part_scan", "shmem_zc", "io_desc_size",
}

// FeatureNames returns the names of the Flag* bits set in flags.
func FeatureNames(flags uint64) []string {
	var names []string
	for i, n := range featureNames {
		if flags&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	for i := len(featureNames); i < 64; i++ {
		if flags&(1<<i) != 0 {
			names = append(names, fmt.Sprintf("bit%d", i))
		}
	}
	return names
}

// StateName returns the name of a device state: dead, live or quiesced.
func StateName(state uint16) string {
	switch state {
	case StateDead:
		return "dead"
	case StateLive:
		return "live"
	case StateQuiesced:
		return "quiesced"
	case StateFailIO:
		return "fail_io"
	}
	return fmt.Sprintf("state%d", state)
}
