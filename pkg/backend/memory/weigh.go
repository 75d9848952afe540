package memory

import (
	"math"
)

// DefaultMaxMemory is the estimated bytes of keys and states a Store holds
// unless WithMaxMemory says otherwise: 256 MiB. With keys of up to about 100
// bytes, DefaultMaxKeys binds first (1,000,000 keys of 268 bytes); with
// longer keys, this bound does.
const DefaultMaxMemory = 256 << 20

// EntryOverhead is the memory of one key in the store beyond the bytes of the
// key itself and of its state's log (State.HeapBytes): the entry (its lock,
// the algorithm's state and the sweeper's instants), otter's node and its
// slots in the hash table and the eviction policy's structures.
// BenchmarkEntryBytes measures it as the live heap per key of a store of
// 20,000 charged keys, less the key's allocation: 236 bytes for keys of 16
// to 4,096 bytes (Go 1.26, amd64), within 4 bytes of this estimate.
const EntryOverhead = 240

// weigher weighs an entry at its estimated bytes, and at least maxMemory /
// maxKeys, so that one weighted bound of maxMemory holds both bounds: never
// more keys than maxKeys (each weighs at least the share of one) and never
// more estimated bytes than maxMemory. Whichever binds first decides; when
// keys are of mixed sizes, small keys count as the share of one key, so the
// store holds somewhat fewer keys than either bound alone would allow.
type weigher struct {
	floor uint64 // the bytes of one key's share: ceil(maxMemory / maxKeys)
}

func newWeigher(maxMemory uint64, maxKeys int) weigher {
	return weigher{floor: max(1, (maxMemory+uint64(maxKeys)-1)/uint64(maxKeys))}
}

// weigh returns the weight of key with entry e, and records in e the state's
// bytes it weighed.
func (w weigher) weigh(key string, e *entry) uint32 {
	extra := e.heapBytes.Load()
	e.weighed.Store(extra)
	b := max(EntryBytes(len(key), int(extra)), w.floor)
	return uint32(min(b, math.MaxUint32))
}

// EntryBytes is the estimated memory of a key of keyLen bytes whose state
// holds stateHeapBytes outside its struct (State.HeapBytes): the key rounded
// up as Go's allocator rounds it, EntryOverhead, and the state's bytes.
func EntryBytes(keyLen, stateHeapBytes int) uint64 {
	return uint64(allocSize(keyLen)) + EntryOverhead + uint64(stateHeapBytes)
}

// allocSize returns the bytes Go's allocator takes for an object of n bytes
// (without pointers), or a little more: small objects are rounded up to a
// size class, and classes are at most 12.5 % apart; large ones take whole
// 8 KB pages.
func allocSize(n int) int {
	switch {
	case n <= 0:
		return 0
	case n <= 32<<10:
		// Size classes are at most 1/8 apart (16 bytes apart up to 128).
		step := 1 << max(4, bitLen(n-1)-3)
		return (n + step - 1) &^ (step - 1)
	}
	return (n + 8191) &^ 8191
}

func bitLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}
