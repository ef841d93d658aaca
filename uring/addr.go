package uring

import "unsafe"

// addr converts a pointer that an SQE hands to the kernel to the 64-bit
// address form used in SQEs, and forces the memory it points to off the
// goroutine stack.
//
// The kernel uses such addresses after the Prep call has returned, but Go
// moves goroutine stacks when they grow and would not update the copy of the
// address in the SQE. Escape analysis would otherwise let a caller's small
// fixed-size buffer live on its stack, since a pointer converted to an
// integer does not escape. Heap and mmap memory never move.
func addr(p unsafe.Pointer) uint64 {
	if escapeHook != nil {
		escapeHook(p) // never called; passing p to unknown code makes it escape
	}
	return uint64(uintptr(p))
}

// escapeHook is always nil; see addr.
var escapeHook func(unsafe.Pointer)
