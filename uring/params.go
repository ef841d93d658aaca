package uring

// Params mirrors struct io_uring_params (120 bytes). It is passed to
// io_uring_setup(2) and filled in by the kernel on return.
//
// The caller sets Flags and, depending on them, CQEntries (SetupCQSize),
// SQThreadCPU (SetupSQAff), SQThreadIdle (SetupSQPoll) and WQFd
// (SetupAttachWQ). Everything else, Resv in particular, must be zero. On
// success the kernel stores the real queue sizes in SQEntries and CQEntries,
// the supported features in Features, and the ring layout in SQOff and CQOff.
type Params struct {
	SQEntries    uint32
	CQEntries    uint32
	Flags        uint32
	SQThreadCPU  uint32
	SQThreadIdle uint32 // milliseconds
	Features     uint32
	WQFd         uint32
	Resv         [3]uint32
	SQOff        SQRingOffsets
	CQOff        CQRingOffsets
}

// SQRingOffsets mirrors struct io_sqring_offsets: the byte offsets of the
// submission ring fields within the SQ ring mapping.
type SQRingOffsets struct {
	Head        uint32
	Tail        uint32
	RingMask    uint32
	RingEntries uint32
	Flags       uint32
	Dropped     uint32
	Array       uint32
	Resv1       uint32
	UserAddr    uint64
}

// CQRingOffsets mirrors struct io_cqring_offsets: the byte offsets of the
// completion ring fields within the CQ ring mapping.
type CQRingOffsets struct {
	Head        uint32
	Tail        uint32
	RingMask    uint32
	RingEntries uint32
	Overflow    uint32
	CQEs        uint32
	Flags       uint32
	Resv1       uint32
	UserAddr    uint64
}
