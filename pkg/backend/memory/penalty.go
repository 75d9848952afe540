package memory

import (
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// DefaultPenaltyKeys is the number of exhausted keys the penalty set holds
// unless WithPenaltyKeys says otherwise (about 13 MB when full: see
// PenaltyRecordBytes).
const DefaultPenaltyKeys = 100_000

// PenaltyRecordBytes is the memory of one penalty record: its heap slot (key
// hash, instant and the algorithm's state, 96 bytes), its map entry and the
// heap's spare capacity; BenchmarkPenaltyBytes measures 129 bytes at 100,000
// records. The key itself is not kept, so a record costs the same whatever
// the key's length. A sliding_window_log record also holds its log
// (State.HeapBytes), and takes the room of as many more records as its log
// has bytes of records, so that the set stays within WithPenaltyKeys x
// PenaltyRecordBytes.
const PenaltyRecordBytes = 130

// The penalty set keeps evicted keys' states that the remembered table does
// not: the live states that do not pack in two words (a sliding_window_log's),
// and the exhausted records the table drops when it is full; without the
// table, the states of exhausted keys. When the cache evicts for size an
// entry that ran out (a decision on it denied, or left it no room for one
// hit, since its state was last fresh) and whose state is not fresh yet, its
// state moves to the penalty set, keyed by a 64-bit hash of its key. When the key is used again, its entry is
// created from that state (and the record dropped), so the key goes on
// exactly where it stopped: a fixed window stays denied until the window
// ends, a token bucket refills one hit at a time, usage accounted past the
// limit is still owed. Nothing that was not evicted is affected, so the
// store's decisions are unchanged while nothing is evicted.
//
// Bounded on its own (WithPenaltyKeys records, a sliding log's taking the
// room of more: see PenaltyRecordBytes): when it is full, the records whose
// states become fresh soonest make room for a new one, or the new one is
// dropped if it is the soonest, and Stats.PenaltyDropped counts them; records
// whose state is fresh again are dropped as they are found (each insert,
// each sweep), which costs nothing.
//
// Two keys with the same 64-bit hash would share a record: a key re-created
// while another key's record is held would take its state. With n records,
// the chance that any given new key collides is n/2^64 (5e-15 for 100,000).
type penalties struct {
	capacity int // in records (see units)
	used     int // the units of the records held

	mu   sync.Mutex
	idx  map[uint64]int // key hash -> position in heap
	heap []penalty      // a min-heap by until
	n    atomic.Int64   // len(heap), read without mu for a fast miss

	saved, restored, dropped atomic.Uint64
}

// penalty is the state of one evicted exhausted key.
type penalty struct {
	hash  uint64
	until int64 // µs: when state is fresh again
	state algorithms.State
}

func newPenalties(capacity int) *penalties {
	return &penalties{capacity: capacity, idx: make(map[uint64]int)}
}

func hashKey(key string) uint64 { return xxhash.Sum64String(key) }

// units is the room a record of state s takes, in records: one, and as many
// more as its log has bytes of records.
func units(s *algorithms.State) int {
	return 1 + (s.HeapBytes()+PenaltyRecordBytes-1)/PenaltyRecordBytes
}

// put records the state of key hash h, fresh again at until, at instant now.
func (p *penalties) put(h uint64, s algorithms.State, until, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	p.saved.Add(1)
	if i, ok := p.idx[h]; ok {
		p.removeAt(i) // the key's older record
	}
	w := units(&s)
	for p.used+w > p.capacity {
		if len(p.heap) == 0 || p.heap[0].until >= until {
			p.dropped.Add(1)
			return // the new record is the soonest to be fresh
		}
		p.removeAt(0)
		p.dropped.Add(1)
	}
	p.used += w
	p.heap = append(p.heap, penalty{hash: h, until: until, state: s})
	p.idx[h] = len(p.heap) - 1
	p.up(len(p.heap) - 1)
	p.n.Store(int64(len(p.heap)))
}

// take removes the record of key hash h and returns its state and the
// instant it is fresh again.
func (p *penalties) take(h uint64) (algorithms.State, int64, bool) {
	if p.n.Load() == 0 {
		return algorithms.State{}, 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := p.idx[h]
	if !ok {
		return algorithms.State{}, 0, false
	}
	r := p.heap[i]
	p.removeAt(i)
	p.restored.Add(1)
	return r.state, r.until, true
}

// expire drops the records whose state is fresh at now, and returns how
// many it dropped.
func (p *penalties) expire(now int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.expireLocked(now)
}

func (p *penalties) expireLocked(now int64) int {
	n := 0
	for len(p.heap) > 0 && p.heap[0].until <= now {
		p.removeAt(0)
		n++
	}
	return n
}

func (p *penalties) len() int { return int(p.n.Load()) }

// removeAt removes the record at position i of the heap.
func (p *penalties) removeAt(i int) {
	last := len(p.heap) - 1
	p.used -= units(&p.heap[i].state)
	delete(p.idx, p.heap[i].hash)
	if i != last {
		p.heap[i] = p.heap[last]
		p.idx[p.heap[i].hash] = i
	}
	p.heap[last] = penalty{} // drop the state's log
	p.heap = p.heap[:last]
	if i != last {
		p.fix(i)
	}
	p.n.Store(int64(len(p.heap)))
}

func (p *penalties) fix(i int) {
	if !p.down(i) {
		p.up(i)
	}
}

func (p *penalties) swap(i, j int) {
	p.heap[i], p.heap[j] = p.heap[j], p.heap[i]
	p.idx[p.heap[i].hash] = i
	p.idx[p.heap[j].hash] = j
}

func (p *penalties) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if p.heap[parent].until <= p.heap[i].until {
			return
		}
		p.swap(i, parent)
		i = parent
	}
}

// down moves the record at i down the heap and reports whether it moved.
func (p *penalties) down(i int) bool {
	start := i
	for {
		l := 2*i + 1
		if l >= len(p.heap) {
			break
		}
		c := l
		if r := l + 1; r < len(p.heap) && p.heap[r].until < p.heap[l].until {
			c = r
		}
		if p.heap[i].until <= p.heap[c].until {
			break
		}
		p.swap(i, c)
		i = c
	}
	return i > start
}
