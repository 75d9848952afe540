package algorithms

import (
	"math"
	"testing"
	"time"
)

// TestPackRoundTrip packs the states of a timeline of every algorithm and
// checks that each unpacks to exactly the state packed, and that states that
// do not fit are refused rather than rounded.
func TestPackRoundTrip(t *testing.T) {
	for _, k := range Kinds() {
		l := Limit{Algorithm: k, Requests: 7, Window: time.Minute}
		var s State
		now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro()
		packed := 0
		for step := range 200 {
			now += int64(step%13) * 997_000
			hits := uint64(step % 4)
			if step%9 == 0 {
				s, _ = AccountMicros(l, s, now, 30) // past the limit
			} else {
				s, _ = DecideMicros(l, s, now, hits)
			}
			p, ok := s.Pack(k)
			if !ok {
				if k != SlidingWindowLog || s.log.n == 0 {
					t.Fatalf("%s step %d: %+v does not pack", k, step, s)
				}
				continue
			}
			packed++
			got := p.Unpack(k)
			if got.at != s.at || got.count != s.count || got.prev != s.prev || got.level != s.level || got.log.n != 0 {
				t.Fatalf("%s step %d: packed %+v, unpacked %+v", k, step, s, got)
			}
		}
		if k != SlidingWindowLog && packed != 200 {
			t.Fatalf("%s: %d of 200 states packed", k, packed)
		}
	}
	counter := []struct {
		s  State
		ok bool
	}{
		{State{at: 1<<56 - 1, count: 1<<36 - 1, prev: 1<<36 - 1}, true},
		{State{at: 1 << 56, count: 1}, false},
		{State{at: 5, count: 1 << 36}, false},
		{State{at: 5, prev: 1 << 36}, false},
		{State{at: 5, count: 0x9_8765_4321, prev: 0xa_bcde_f012}, true},
	}
	for _, c := range counter {
		p, ok := c.s.Pack(SlidingWindowCounter)
		if ok != c.ok {
			t.Fatalf("%+v: packs %v, want %v", c.s, ok, c.ok)
		}
		if ok {
			if got := p.Unpack(SlidingWindowCounter); got.at != c.s.at || got.count != c.s.count || got.prev != c.s.prev {
				t.Fatalf("packed %+v, unpacked %+v", c.s, got)
			}
		}
	}
	if _, ok := (State{at: 3, count: 2}).Pack(TokenBucket); ok {
		t.Fatal("a fixed window's state packed as a token bucket's")
	}
	if _, ok := (State{at: -1}).Pack(FixedWindow); ok {
		t.Fatal("a negative instant packed")
	}
	p, _ := (State{at: 3, level: math.Pi}).Pack(GCRA)
	if got := p.Unpack(GCRA); got.level != math.Pi {
		t.Fatalf("level %v", got.level)
	}
}
