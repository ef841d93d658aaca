package uring

// Constants from the Linux UAPI header <linux/io_uring.h> (kernel 6.12).
// Values are checked against the header; the kernel ABI never changes them.

// Flags for io_uring_setup(2), IORING_SETUP_*. They go in Params.Flags or the
// flags argument of New.
const (
	SetupIOPoll           uint32 = 1 << 0  // IORING_SETUP_IOPOLL: completions are polled, not interrupt driven
	SetupSQPoll           uint32 = 1 << 1  // IORING_SETUP_SQPOLL: a kernel thread polls the submission queue
	SetupSQAff            uint32 = 1 << 2  // IORING_SETUP_SQ_AFF: Params.SQThreadCPU is valid
	SetupCQSize           uint32 = 1 << 3  // IORING_SETUP_CQSIZE: Params.CQEntries sets the CQ size
	SetupClamp            uint32 = 1 << 4  // IORING_SETUP_CLAMP: clamp too large sizes instead of failing
	SetupAttachWQ         uint32 = 1 << 5  // IORING_SETUP_ATTACH_WQ: share the io-wq of Params.WQFd
	SetupRDisabled        uint32 = 1 << 6  // IORING_SETUP_R_DISABLED: start disabled, see Ring.EnableRings
	SetupSubmitAll        uint32 = 1 << 7  // IORING_SETUP_SUBMIT_ALL: keep submitting after an SQE fails
	SetupCoopTaskrun      uint32 = 1 << 8  // IORING_SETUP_COOP_TASKRUN: run task work only on kernel entry
	SetupTaskrunFlag      uint32 = 1 << 9  // IORING_SETUP_TASKRUN_FLAG: flag pending task work in the SQ ring
	SetupSQE128           uint32 = 1 << 10 // IORING_SETUP_SQE128: 128-byte SQEs (needed by most URING_CMD users)
	SetupCQE32            uint32 = 1 << 11 // IORING_SETUP_CQE32: 32-byte CQEs
	SetupSingleIssuer     uint32 = 1 << 12 // IORING_SETUP_SINGLE_ISSUER: only one task submits
	SetupDeferTaskrun     uint32 = 1 << 13 // IORING_SETUP_DEFER_TASKRUN: run task work only when waiting for events
	SetupNoMmap           uint32 = 1 << 14 // IORING_SETUP_NO_MMAP: application provides ring memory (not supported here)
	SetupRegisteredFdOnly uint32 = 1 << 15 // IORING_SETUP_REGISTERED_FD_ONLY: no ring fd (not supported here)
	SetupNoSQArray        uint32 = 1 << 16 // IORING_SETUP_NO_SQARRAY: no SQ index array (kernel 6.6+)
)

// Submission opcodes, enum io_uring_op (SQE.Opcode).
const (
	OpNop            uint8 = 0
	OpReadv          uint8 = 1
	OpWritev         uint8 = 2
	OpFsync          uint8 = 3
	OpReadFixed      uint8 = 4
	OpWriteFixed     uint8 = 5
	OpPollAdd        uint8 = 6
	OpPollRemove     uint8 = 7
	OpSyncFileRange  uint8 = 8
	OpSendmsg        uint8 = 9
	OpRecvmsg        uint8 = 10
	OpTimeout        uint8 = 11
	OpTimeoutRemove  uint8 = 12
	OpAccept         uint8 = 13
	OpAsyncCancel    uint8 = 14
	OpLinkTimeout    uint8 = 15
	OpConnect        uint8 = 16
	OpFallocate      uint8 = 17
	OpOpenat         uint8 = 18
	OpClose          uint8 = 19
	OpFilesUpdate    uint8 = 20
	OpStatx          uint8 = 21
	OpRead           uint8 = 22
	OpWrite          uint8 = 23
	OpFadvise        uint8 = 24
	OpMadvise        uint8 = 25
	OpSend           uint8 = 26
	OpRecv           uint8 = 27
	OpOpenat2        uint8 = 28
	OpEpollCtl       uint8 = 29
	OpSplice         uint8 = 30
	OpProvideBuffers uint8 = 31
	OpRemoveBuffers  uint8 = 32
	OpTee            uint8 = 33
	OpShutdown       uint8 = 34
	OpRenameat       uint8 = 35
	OpUnlinkat       uint8 = 36
	OpMkdirat        uint8 = 37
	OpSymlinkat      uint8 = 38
	OpLinkat         uint8 = 39
	OpMsgRing        uint8 = 40
	OpFsetxattr      uint8 = 41
	OpSetxattr       uint8 = 42
	OpFgetxattr      uint8 = 43
	OpGetxattr       uint8 = 44
	OpSocket         uint8 = 45
	OpUringCmd       uint8 = 46
	OpSendZC         uint8 = 47
	OpSendmsgZC      uint8 = 48
	OpReadMultishot  uint8 = 49
	OpWaitid         uint8 = 50
	OpFutexWait      uint8 = 51
	OpFutexWake      uint8 = 52
	OpFutexWaitv     uint8 = 53
	OpFixedFdInstall uint8 = 54
	OpFtruncate      uint8 = 55
	OpBind           uint8 = 56
	OpListen         uint8 = 57
	// OpLast is IORING_OP_LAST, one past the last opcode known to 6.12.
	OpLast uint8 = 58
)

// SQE flags, IOSQE_* (SQE.Flags).
const (
	SQEFixedFile      uint8 = 1 << 0 // IOSQE_FIXED_FILE: SQE.Fd indexes the registered file table
	SQEIODrain        uint8 = 1 << 1 // IOSQE_IO_DRAIN: issue after all earlier requests complete
	SQEIOLink         uint8 = 1 << 2 // IOSQE_IO_LINK: the next SQE starts when this one succeeds
	SQEIOHardlink     uint8 = 1 << 3 // IOSQE_IO_HARDLINK: like SQEIOLink, regardless of the result
	SQEAsync          uint8 = 1 << 4 // IOSQE_ASYNC: always issue from an io-wq worker
	SQEBufferSelect   uint8 = 1 << 5 // IOSQE_BUFFER_SELECT: pick a provided buffer from SQE.BufIndex's group
	SQECQESkipSuccess uint8 = 1 << 6 // IOSQE_CQE_SKIP_SUCCESS: post no CQE if the request succeeds
)

// FileIndexAlloc (IORING_FILE_INDEX_ALLOC) in SQE.SpliceFdIn (file_index)
// asks the kernel to pick a free direct descriptor slot.
const FileIndexAlloc uint32 = ^uint32(0)

// URING_CMD flags (SQE.OpFlags, uring_cmd_flags).
const (
	UringCmdFixed     uint32 = 1 << 0 // IORING_URING_CMD_FIXED: use the registered buffer SQE.BufIndex
	UringCmdMultishot uint32 = 1 << 1 // IORING_URING_CMD_MULTISHOT: post CQEs (with CQEFMore) into provided buffers
)

// Fsync flags (SQE.OpFlags, fsync_flags).
const (
	FsyncDatasync uint32 = 1 << 0 // IORING_FSYNC_DATASYNC: fdatasync instead of fsync
)

// Timeout flags (SQE.OpFlags, timeout_flags).
const (
	TimeoutAbs          uint32 = 1 << 0 // IORING_TIMEOUT_ABS
	TimeoutUpdate       uint32 = 1 << 1 // IORING_TIMEOUT_UPDATE
	TimeoutBoottime     uint32 = 1 << 2 // IORING_TIMEOUT_BOOTTIME
	TimeoutRealtime     uint32 = 1 << 3 // IORING_TIMEOUT_REALTIME
	LinkTimeoutUpdate   uint32 = 1 << 4 // IORING_LINK_TIMEOUT_UPDATE
	TimeoutETimeSuccess uint32 = 1 << 5 // IORING_TIMEOUT_ETIME_SUCCESS
	TimeoutMultishot    uint32 = 1 << 6 // IORING_TIMEOUT_MULTISHOT
)

// POLL_ADD command flags. The poll events occupy SQE.OpFlags, so these go in
// SQE.Len.
const (
	PollAddMulti       uint32 = 1 << 0 // IORING_POLL_ADD_MULTI: keep posting CQEs (with CQEFMore)
	PollUpdateEvents   uint32 = 1 << 1 // IORING_POLL_UPDATE_EVENTS
	PollUpdateUserData uint32 = 1 << 2 // IORING_POLL_UPDATE_USER_DATA
	PollAddLevel       uint32 = 1 << 3 // IORING_POLL_ADD_LEVEL: level triggered
)

// ASYNC_CANCEL flags (SQE.OpFlags, cancel_flags).
const (
	AsyncCancelAll      uint32 = 1 << 0 // IORING_ASYNC_CANCEL_ALL: cancel every match, not just the first
	AsyncCancelFd       uint32 = 1 << 1 // IORING_ASYNC_CANCEL_FD: match on SQE.Fd instead of user data
	AsyncCancelAny      uint32 = 1 << 2 // IORING_ASYNC_CANCEL_ANY: match any request
	AsyncCancelFdFixed  uint32 = 1 << 3 // IORING_ASYNC_CANCEL_FD_FIXED: SQE.Fd is a registered file index
	AsyncCancelUserdata uint32 = 1 << 4 // IORING_ASYNC_CANCEL_USERDATA: match on user data (the default)
	AsyncCancelOp       uint32 = 1 << 5 // IORING_ASYNC_CANCEL_OP: match on opcode
)

// Send/recv flags, kept in SQE.IoPrio.
const (
	RecvsendPollFirst uint16 = 1 << 0 // IORING_RECVSEND_POLL_FIRST
	RecvMultishot     uint16 = 1 << 1 // IORING_RECV_MULTISHOT
	RecvsendFixedBuf  uint16 = 1 << 2 // IORING_RECVSEND_FIXED_BUF
	SendZCReportUsage uint16 = 1 << 3 // IORING_SEND_ZC_REPORT_USAGE
	RecvsendBundle    uint16 = 1 << 4 // IORING_RECVSEND_BUNDLE
	AcceptMultishot   uint16 = 1 << 0 // IORING_ACCEPT_MULTISHOT
	AcceptDontwait    uint16 = 1 << 1 // IORING_ACCEPT_DONTWAIT
	AcceptPollFirst   uint16 = 1 << 2 // IORING_ACCEPT_POLL_FIRST
)

// NotifUsageZCCopied (IORING_NOTIF_USAGE_ZC_COPIED) is set in CQE.Res of a
// CQEFNotif completion when SendZCReportUsage was asked for and the data was
// copied (at least partly) instead of sent zero-copy.
const NotifUsageZCCopied uint32 = 1 << 31

// NOP flags (SQE.OpFlags, nop_flags).
const (
	NopInjectResult uint32 = 1 << 0 // IORING_NOP_INJECT_RESULT: complete with CQE.Res = int32(SQE.Len)
)

// CQE flags, IORING_CQE_F_* (CQE.Flags).
const (
	CQEFBuffer       uint32 = 1 << 0 // IORING_CQE_F_BUFFER: the upper 16 bits hold a buffer ID
	CQEFMore         uint32 = 1 << 1 // IORING_CQE_F_MORE: the request will post more CQEs
	CQEFSockNonempty uint32 = 1 << 2 // IORING_CQE_F_SOCK_NONEMPTY
	CQEFNotif        uint32 = 1 << 3 // IORING_CQE_F_NOTIF: zero-copy send notification
	CQEFBufMore      uint32 = 1 << 4 // IORING_CQE_F_BUF_MORE

	// CQEBufferShift (IORING_CQE_BUFFER_SHIFT) is the shift of the buffer ID
	// in CQE.Flags when CQEFBuffer is set.
	CQEBufferShift = 16
)

// SQ ring flags, IORING_SQ_*, set by the kernel (see Ring.SQFlags).
const (
	SQNeedWakeup uint32 = 1 << 0 // IORING_SQ_NEED_WAKEUP: the SQPOLL thread sleeps
	SQCQOverflow uint32 = 1 << 1 // IORING_SQ_CQ_OVERFLOW: completions wait in the overflow list
	SQTaskrun    uint32 = 1 << 2 // IORING_SQ_TASKRUN: task work is pending, enter the kernel
)

// CQ ring flags, IORING_CQ_*, set by the application.
const (
	CQEventfdDisabled uint32 = 1 << 0 // IORING_CQ_EVENTFD_DISABLED
)

// Flags for io_uring_enter(2), IORING_ENTER_*.
const (
	EnterGetEvents      uint32 = 1 << 0 // IORING_ENTER_GETEVENTS: wait for min_complete CQEs
	EnterSQWakeup       uint32 = 1 << 1 // IORING_ENTER_SQ_WAKEUP: wake the SQPOLL thread
	EnterSQWait         uint32 = 1 << 2 // IORING_ENTER_SQ_WAIT: wait for SQ space (SQPOLL)
	EnterExtArg         uint32 = 1 << 3 // IORING_ENTER_EXT_ARG
	EnterRegisteredRing uint32 = 1 << 4 // IORING_ENTER_REGISTERED_RING
	EnterAbsTimer       uint32 = 1 << 5 // IORING_ENTER_ABS_TIMER
)

// Feature bits reported by the kernel, IORING_FEAT_* (Ring.Features,
// Params.Features).
const (
	FeatSingleMmap     uint32 = 1 << 0
	FeatNodrop         uint32 = 1 << 1
	FeatSubmitStable   uint32 = 1 << 2
	FeatRWCurPos       uint32 = 1 << 3
	FeatCurPersonality uint32 = 1 << 4
	FeatFastPoll       uint32 = 1 << 5
	FeatPoll32Bits     uint32 = 1 << 6
	FeatSQPollNonfixed uint32 = 1 << 7
	FeatExtArg         uint32 = 1 << 8
	FeatNativeWorkers  uint32 = 1 << 9
	FeatRsrcTags       uint32 = 1 << 10
	FeatCQESkip        uint32 = 1 << 11
	FeatLinkedFile     uint32 = 1 << 12
	FeatRegRegRing     uint32 = 1 << 13
	FeatRecvsendBundle uint32 = 1 << 14
	FeatMinTimeout     uint32 = 1 << 15
)

// Opcodes for io_uring_register(2), enum io_uring_register_op.
const (
	RegBuffers           uint32 = 0
	UnregBuffers         uint32 = 1
	RegFiles             uint32 = 2
	UnregFiles           uint32 = 3
	RegEventfd           uint32 = 4
	UnregEventfd         uint32 = 5
	RegFilesUpdate       uint32 = 6
	RegEventfdAsync      uint32 = 7
	RegProbe             uint32 = 8
	RegPersonality       uint32 = 9
	UnregPersonality     uint32 = 10
	RegRestrictions      uint32 = 11
	RegEnableRings       uint32 = 12
	RegFiles2            uint32 = 13
	RegFilesUpdate2      uint32 = 14
	RegBuffers2          uint32 = 15
	RegBuffersUpdate     uint32 = 16
	RegIOWQAff           uint32 = 17
	UnregIOWQAff         uint32 = 18
	RegIOWQMaxWorkers    uint32 = 19
	RegRingFds           uint32 = 20
	UnregRingFds         uint32 = 21
	RegPbufRing          uint32 = 22
	UnregPbufRing        uint32 = 23
	RegSyncCancel        uint32 = 24
	RegFileAllocRange    uint32 = 25
	RegPbufStatus        uint32 = 26
	RegNapi              uint32 = 27
	UnregNapi            uint32 = 28
	RegClock             uint32 = 29
	RegCloneBuffers      uint32 = 30
	RegLast              uint32 = 31      // IORING_REGISTER_LAST
	RegUseRegisteredRing uint32 = 1 << 31 // IORING_REGISTER_USE_REGISTERED_RING, or'ed into the opcode
)

// RegisterFilesSkip (IORING_REGISTER_FILES_SKIP) in an UpdateFiles slice
// leaves that slot unchanged.
const RegisterFilesSkip int32 = -2

// ProbeOpSupported (IO_URING_OP_SUPPORTED) is set in ProbeOp.Flags for
// opcodes the kernel implements.
const ProbeOpSupported uint16 = 1 << 0

// Magic mmap(2) offsets of the ring regions, IORING_OFF_*.
const (
	offSQRing int64 = 0
	offCQRing int64 = 0x8000000
	offSQEs   int64 = 0x10000000
)
