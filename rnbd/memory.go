package rnbd

import (
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A memory export is a device held in the server's memory, for demos and
// benchmarks: it needs no disk and its speed is the transport's. Its
// contents start as zeros and are lost when the server stops. It is named
// by its device_path exactly (no search path applies), and the same
// access rules hold as for a file.

// memoryPrefix keys memory exports among the resolved export paths.
const memoryPrefix = "memory:"

// memoryStore is the memory of one memory export, shared by the sessions
// that map it.
type memoryStore struct {
	name string
	mem  []byte // anonymous mapping, MAP_NORESERVE: untouched pages cost nothing
}

// memoryStores are a server's memory exports, allocated on first open.
type memoryStores struct {
	mu     sync.Mutex
	sizes  map[string]uint64
	stores map[string]*memoryStore
}

func newMemoryStores(sizes map[string]uint64) (*memoryStores, error) {
	for name, size := range sizes {
		if name == "" || size == 0 || size%4096 != 0 {
			return nil, fmt.Errorf("rnbd: memory export %q of %d bytes: want a name and a size that is a multiple of 4096: %w", name, size, syscall.EINVAL)
		}
	}
	return &memoryStores{sizes: sizes, stores: map[string]*memoryStore{}}, nil
}

// lookup returns the memory export called name, allocating it on first
// use; ok is false when there is none of that name.
func (m *memoryStores) lookup(name string) (st *memoryStore, ok bool, err error) {
	size, ok := m.sizes[name]
	if !ok {
		return nil, false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.stores[name]; st != nil {
		return st, true, nil
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, true, fmt.Errorf("memory export %s: allocate %d bytes: %w", name, size, err)
	}
	st = &memoryStore{name: name, mem: mem}
	m.stores[name] = st
	return st, true, nil
}

// close frees every memory export.
func (m *memoryStores) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, st := range m.stores {
		unix.Munmap(st.mem)
		delete(m.stores, name)
	}
}

// serveMemory performs one request on a memory export; bounds and access
// were checked by backend.serve.
func (st *memoryStore) serve(op IOOp, off int64, n int, data []byte) int {
	switch op {
	case OpRead:
		copy(data[:n], st.mem[off:])
	case OpWrite:
		copy(st.mem[off:off+int64(n)], data[:n])
	case OpFlush:
	case OpDiscard, OpWriteZeroes:
		clear(st.mem[off : off+int64(n)])
	default:
		return -int(syscall.EOPNOTSUPP)
	}
	return 0
}
