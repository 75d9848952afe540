//go:build !unix

package memory

// allocBuckets returns n zeroed buckets, and the function that releases them
// (the collector does).
func allocBuckets(n uint64) ([][bucketSlots]slot, func()) {
	return make([][bucketSlots]slot, n), func() {}
}
