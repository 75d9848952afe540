package algorithms

import "math"

// Packed is a State in two 64-bit words, for a store that keeps many states
// compactly (the memory store's remembered table). It holds no pointer.
type Packed [2]uint64

// Bits of a packed sliding_window_counter state: its window start and its
// two counts share the two words.
const (
	packAtBits    = 56
	packCountBits = 36
)

// Pack returns s, a state of a limit of algorithm k, in two words, and
// whether it fits: every fixed_window, token_bucket and gcra state does; a
// sliding_window_counter state does when its window start is below 2^56 µs
// (the year 4253) and both its counts below 2^36; a sliding_window_log state
// only when its log is empty. A state that does not fit is not packed (ok is
// false), never rounded: Unpack gives back exactly the state packed.
func (s State) Pack(k Kind) (p Packed, ok bool) {
	if s.at < 0 {
		return Packed{}, false
	}
	switch k {
	case FixedWindow:
		if s.prev != 0 || s.level != 0 || s.log.n != 0 {
			return Packed{}, false
		}
		return Packed{uint64(s.at), s.count}, true
	case TokenBucket, GCRA:
		if s.count != 0 || s.prev != 0 || s.log.n != 0 {
			return Packed{}, false
		}
		return Packed{uint64(s.at), math.Float64bits(s.level)}, true
	case SlidingWindowCounter:
		const countMax = 1<<packCountBits - 1
		if s.at >= 1<<packAtBits || s.count > countMax || s.prev > countMax || s.level != 0 || s.log.n != 0 {
			return Packed{}, false
		}
		// Word 0: at (56 bits) and the low 8 bits of count; word 1: the
		// other 28 bits of count and prev (36 bits).
		return Packed{uint64(s.at) | s.count<<packAtBits, s.count>>(64-packAtBits) | s.prev<<(packCountBits-(64-packAtBits))}, true
	case SlidingWindowLog:
		if s.log.n != 0 || s.count != 0 || s.prev != 0 || s.level != 0 {
			return Packed{}, false
		}
		return Packed{uint64(s.at), 0}, true
	}
	return Packed{}, false
}

// Unpack returns the State that Pack(k) packed into p.
func (p Packed) Unpack(k Kind) State {
	switch k {
	case TokenBucket, GCRA:
		return State{at: int64(p[0]), level: math.Float64frombits(p[1])}
	case SlidingWindowCounter:
		const low = 64 - packAtBits // bits of count in word 0
		count := p[0]>>packAtBits | (p[1]&(1<<(packCountBits-low)-1))<<low
		return State{at: int64(p[0] & (1<<packAtBits - 1)), count: count, prev: p[1] >> (packCountBits - low)}
	case SlidingWindowLog:
		return State{at: int64(p[0])}
	}
	return State{at: int64(p[0]), count: p[1]}
}
