//go:build unix

package memory

import (
	"syscall"
	"unsafe"
)

// allocBuckets returns n zeroed buckets outside Go's heap, and the function
// that releases them. The remembered table holds no pointer, so the collector
// need not see it; kept out of the heap, it does not raise the collector's
// target either (a 64 MB table in the heap would let 64 MB more garbage pile
// up before each collection), and only the pages records land in are
// resident. If the mapping fails, the buckets come from the heap.
func allocBuckets(n uint64) ([][bucketSlots]slot, func()) {
	size := int(n) * int(unsafe.Sizeof([bucketSlots]slot{}))
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([][bucketSlots]slot, n), func() {}
	}
	return unsafe.Slice((*[bucketSlots]slot)(unsafe.Pointer(unsafe.SliceData(mem))), n), func() { syscall.Munmap(mem) }
}
