package memory

import (
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// DefaultRememberedKeys is the number of records the remembered table holds
// unless WithRememberedKeys says otherwise: twice DefaultMaxKeys, so that a
// flood of that many distinct keys costs no key anything (about 64 MB: see
// RememberedRecordBytes).
const DefaultRememberedKeys = 2 * DefaultMaxKeys

// RememberedRecordBytes is the memory of one record of the remembered table:
// the key's 64-bit hash, the instant its state is fresh (with the algorithm
// and the record's cost) and the state in two words. The table is allocated
// whole when the store is created, but its pages are only resident once
// records land in them.
const RememberedRecordBytes = 32

// bucketSlots is the number of records of a bucket of the remembered table.
const bucketSlots = 8

// costExhausted is the cost of a record of a key that ran out; part-used
// keys cost from 0 to costExhausted-1, by the share of their limit used.
const costExhausted = 31

// The remembered table keeps the state of live keys that the cache evicts:
// when the cache evicts for size an entry whose state is not fresh yet (part
// used, or exhausted) and whose state packs in two words
// (algorithms.State.Pack: every state but a non-empty sliding_window_log),
// the state moves here, keyed by a 64-bit hash of the key. When the key is
// used again its entry is created from that state, so it goes on exactly
// where it stopped. Nothing that was not evicted is affected.
//
// Layout: an open-addressing table of fixed capacity, split in shards of
// their own lock; a key's record lies in one of two buckets of 8 slots of
// 32 bytes. Two choices keep the buckets even, and a record of a full bucket
// may move to its other one (see relocateDepth): the table fills to about
// 96 % before a new record finds no room, whatever its size. No pointer, so the collector does
// not scan it, and it lives outside Go's heap (see allocBuckets). A shard's
// slots are allocated by its first record, so a store that evicts no live key
// takes none of this memory.
//
// When both buckets of a new record are full, the record that costs least
// makes room: one whose state is fresh again (it costs nothing), else the
// part-used one with the least share of its limit used, else the exhausted
// one whose state is fresh soonest, the new record included (then it is not
// kept). A dropped exhausted record moves to the penalty set.
//
// A record is found by the full 64-bit hash: two keys with the same hash
// would share a record (with n records, a chance of n/2^64 per new key: 1 in
// 9 × 10^12 with the table full by default); a key whose hash matches no
// record starts fresh, as it would without the table.
type remembered struct {
	shards []rememberShard
	nb     uint64 // buckets per shard

	n atomic.Int64 // records held

	saved, restored           atomic.Uint64
	droppedPart, droppedSpent atomic.Uint64
}

type rememberShard struct {
	mu   sync.Mutex
	n    int                 // records held in the shard
	b    [][bucketSlots]slot // allocated by the shard's first put (allocBuckets)
	free func()              // releases b
}

// slot is one record. meta is 0 for an empty slot, otherwise until (µs, 56
// bits, saturated: the largest value means never), the algorithm (3 bits)
// and the cost (5 bits).
type slot struct {
	hash  uint64
	meta  uint64
	state algorithms.Packed
}

const (
	untilBits = 56
	untilMax  = 1<<untilBits - 1
)

// record is an unpacked slot.
type record struct {
	hash  uint64
	until int64 // µs: when the state is fresh again
	kind  algorithms.Kind
	cost  uint8
	state algorithms.Packed
}

func (r record) meta() uint64 {
	u := uint64(max(1, min(r.until, untilMax)))
	return u | uint64(r.kind&7)<<untilBits | uint64(r.cost&31)<<(untilBits+3)
}

func (s *slot) record() record {
	until := int64(s.meta & untilMax)
	if until == untilMax {
		until = math.MaxInt64
	}
	return record{hash: s.hash, until: until, kind: algorithms.Kind(s.meta >> untilBits & 7), cost: uint8(s.meta >> (untilBits + 3)), state: s.state}
}

func (s *slot) until() int64 { return int64(s.meta & untilMax) }

// cheaper reports whether dropping r costs less than dropping o: by cost,
// then by the instant their state is fresh.
func (r record) cheaper(o record) bool {
	if r.cost != o.cost {
		return r.cost < o.cost
	}
	return r.until < o.until
}

func newRemembered(capacity int) *remembered {
	buckets := uint64(capacity+bucketSlots-1) / bucketSlots
	// Shards of at least 2,048 buckets (16,384 records): the records of
	// smaller ones would spread too unevenly over them (the first drop
	// would come at a lower fill).
	shards := min(64, max(1, buckets/2048))
	nb := (buckets + shards - 1) / shards
	t := &remembered{shards: make([]rememberShard, shards), nb: nb}
	// The buckets live outside the heap: release them once the table is
	// unreachable (no lookup can run then).
	runtime.AddCleanup(t, func(shards []rememberShard) {
		for i := range shards {
			if f := shards[i].free; f != nil {
				f()
			}
		}
	}, t.shards)
	return t
}

// capacity returns the number of records the table holds when full.
func (t *remembered) capacity() int { return len(t.shards) * int(t.nb) * bucketSlots }

// locate returns the shard of hash h and the indices of its two buckets in
// the shard.
func (t *remembered) locate(h uint64) (*rememberShard, uint64, uint64) {
	s := (h >> 32) * uint64(len(t.shards)) >> 32
	b1 := (h & math.MaxUint32) * t.nb >> 32
	b2 := ((h * 0x9e3779b97f4a7c15) >> 32) * t.nb >> 32
	if b2 == b1 && t.nb > 1 {
		b2 = (b1 + 1) % t.nb
	}
	return &t.shards[s], b1, b2
}

// put records r at instant now. When there is no room, the record that costs
// least is dropped (r itself, if it is that record) and returned.
func (t *remembered) put(r record, now int64) (record, bool) {
	sh, b1, b2 := t.locate(r.hash)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t.saved.Add(1)
	if sh.b == nil {
		sh.b, sh.free = allocBuckets(t.nb)
	}
	buckets := [2]*[bucketSlots]slot{&sh.b[b1], &sh.b[b2]}
	if b1 == b2 {
		buckets[1] = nil
	}
	var (
		room      [2]int
		first     [2]*slot // the first empty or expired slot of each bucket
		victim    *slot
		victimRec record
	)
	for bi, b := range buckets {
		if b == nil {
			continue
		}
		for i := range b {
			s := &b[i]
			switch {
			case s.meta == 0 || s.until() <= now:
				room[bi]++
				if first[bi] == nil {
					first[bi] = s
				}
			case s.hash == r.hash: // the key's older record
				s.meta, s.state = r.meta(), r.state
				return record{}, false
			default:
				if sr := s.record(); victim == nil || sr.cheaper(victimRec) {
					victim, victimRec = s, sr
				}
			}
		}
	}
	if room[0]+room[1] == 0 && buckets[1] != nil && t.relocate(sh, buckets, now) {
		room[0], first[0] = 1, nil
		for i := range buckets[0] {
			if s := &buckets[0][i]; s.meta == 0 {
				first[0] = s
				break
			}
		}
		if first[0] == nil {
			for i := range buckets[1] {
				if s := &buckets[1][i]; s.meta == 0 {
					first[0] = s
					break
				}
			}
		}
	}
	if room[0]+room[1] == 0 {
		if !victimRec.cheaper(r) {
			t.countDrop(r)
			return r, true
		}
		*victim = slot{hash: r.hash, meta: r.meta(), state: r.state}
		t.countDrop(victimRec)
		return victimRec, true
	}
	free := first[0]
	if room[1] > room[0] {
		free = first[1]
	}
	// An expired record of the key may be left in another free slot: clear
	// it, so that take finds only the new one.
	for _, b := range buckets {
		if b == nil {
			continue
		}
		for i := range b {
			if s := &b[i]; s != free && s.meta != 0 && s.hash == r.hash {
				*s = slot{}
				sh.n--
				t.n.Add(-1)
			}
		}
	}
	if free.meta == 0 {
		sh.n++
		t.n.Add(1)
	}
	*free = slot{hash: r.hash, meta: r.meta(), state: r.state}
	return record{}, false
}

// relocateDepth is how far relocate looks for room: a record of a full
// bucket moves to its other bucket, or one of that bucket's records first
// moves to its own other bucket (two steps of cuckoo hashing). With it the
// table fills to about 96 % before a record finds no room; a put into a
// full neighbourhood reads at most 2 x 8 x (1 + 8) buckets.
const relocateDepth = 2

// relocate makes room in one of the two full buckets of a new record by
// moving records to their other buckets (see relocateDepth). It reports
// whether it made room.
func (t *remembered) relocate(sh *rememberShard, buckets [2]*[bucketSlots]slot, now int64) bool {
	return t.makeRoom(sh, buckets[0], relocateDepth, now) || t.makeRoom(sh, buckets[1], relocateDepth, now)
}

// makeRoom frees a slot of the full bucket b by moving one of its records to
// its other bucket, making room there first, up to depth steps away.
func (t *remembered) makeRoom(sh *rememberShard, b *[bucketSlots]slot, depth int, now int64) bool {
	for i := range b {
		s := &b[i]
		_, b1, b2 := t.locate(s.hash)
		alt := &sh.b[b1]
		if alt == b {
			alt = &sh.b[b2]
		}
		if alt == b {
			continue
		}
		d := freeSlot(alt, now)
		if d == nil && depth > 1 && t.makeRoom(sh, alt, depth-1, now) {
			d = freeSlot(alt, now)
		}
		if d == nil {
			continue
		}
		if d.meta != 0 { // an expired record: it goes
			sh.n--
			t.n.Add(-1)
		}
		*d, *s = *s, slot{}
		return true
	}
	return false
}

// freeSlot returns an empty slot of b, or else one whose state is fresh at
// now, or nil.
func freeSlot(b *[bucketSlots]slot, now int64) *slot {
	var expired *slot
	for i := range b {
		switch s := &b[i]; {
		case s.meta == 0:
			return s
		case expired == nil && s.until() <= now:
			expired = s
		}
	}
	return expired
}

func (t *remembered) countDrop(r record) {
	if r.cost >= costExhausted {
		t.droppedSpent.Add(1)
	} else {
		t.droppedPart.Add(1)
	}
}

// take removes the record of key hash h and returns it, if its state is not
// fresh at now.
func (t *remembered) take(h uint64, now int64) (record, bool) {
	if t.n.Load() == 0 {
		return record{}, false
	}
	sh, b1, b2 := t.locate(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.b == nil {
		return record{}, false
	}
	for _, bi := range [2]uint64{b1, b2} {
		b := &sh.b[bi]
		for i := range b {
			s := &b[i]
			if s.meta == 0 || s.hash != h {
				continue
			}
			r := s.record()
			*s = slot{}
			sh.n--
			t.n.Add(-1)
			if r.until <= now {
				return record{}, false // fresh: as if absent
			}
			t.restored.Add(1)
			return r, true
		}
	}
	return record{}, false
}

// expire drops the records whose state is fresh at now, and returns how many
// it dropped. It reads only the shards that hold records.
func (t *remembered) expire(now int64) int {
	dropped := 0
	for si := range t.shards {
		sh := &t.shards[si]
		sh.mu.Lock()
		if sh.n > 0 {
			for bi := range sh.b {
				b := &sh.b[bi]
				for i := range b {
					if s := &b[i]; s.meta != 0 && s.until() <= now {
						*s = slot{}
						sh.n--
						t.n.Add(-1)
						dropped++
					}
				}
			}
		}
		sh.mu.Unlock()
	}
	return dropped
}

func (t *remembered) len() int { return int(t.n.Load()) }

// scaled returns a decision's limit and remaining, shifted right together
// until the limit fits in 16 bits: their ratio, for costOf, without a
// division on the request path.
func scaled(limit, remaining uint64) (uint16, uint16) {
	sh := max(0, bits.Len64(limit)-16)
	return uint16(limit >> sh), uint16(min(remaining, limit) >> sh)
}

// costOf is the cost of a key whose decision left left of limit (scaled):
// the share of its limit used, from 0 (nothing) to costExhausted-1 (all but
// a sliver).
func costOf(limit, left uint16) uint8 {
	if limit == 0 || left >= limit {
		return 0
	}
	used, l := uint32(limit-left), uint32(limit)
	return uint8(min(costExhausted-1, (used*(costExhausted-1)+l-1)/l))
}
