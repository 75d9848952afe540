package memory

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

func rec(h uint64, until int64, cost uint8) record {
	return record{hash: h, until: until, kind: algorithms.FixedWindow, cost: cost, state: algorithms.Packed{uint64(h), uint64(cost)}}
}

// TestRememberedPutTake stores, replaces and takes records, and treats a
// record whose state is fresh, or a hash it does not hold, as absent.
func TestRememberedPutTake(t *testing.T) {
	tb := newRemembered(1000)
	if c := tb.capacity(); c < 1000 || c > 1000+64*bucketSlots {
		t.Fatalf("capacity %d for 1000", c)
	}
	if _, full := tb.put(rec(1, 100, 3), 10); full {
		t.Fatal("empty table full")
	}
	if _, full := tb.put(rec(1, 200, 7), 10); full || tb.len() != 1 { // the key's newer record
		t.Fatalf("replaced: %d records", tb.len())
	}
	tb.put(rec(2, 50, costExhausted), 10)
	tb.put(record{hash: 3, until: math.MaxInt64, kind: algorithms.GCRA, cost: 1, state: algorithms.Packed{5, 6}}, 10)
	if _, ok := tb.take(4, 10); ok {
		t.Fatal("took a record of a hash never put")
	}
	if r, ok := tb.take(1, 10); !ok || r.until != 200 || r.cost != 7 || r.state != (algorithms.Packed{1, 7}) || r.kind != algorithms.FixedWindow {
		t.Fatalf("took %+v, %v", r, ok)
	}
	if _, ok := tb.take(1, 10); ok {
		t.Fatal("took a record twice")
	}
	if r, ok := tb.take(3, 10); !ok || r.until != math.MaxInt64 || r.kind != algorithms.GCRA || r.state != (algorithms.Packed{5, 6}) {
		t.Fatalf("never-fresh record: %+v, %v", r, ok)
	}
	if _, ok := tb.take(2, 50); ok || tb.len() != 0 { // fresh at 50
		t.Fatalf("took a fresh record; %d left", tb.len())
	}
	tb.put(rec(5, 60, 1), 10)
	tb.put(rec(6, 70, 1), 10)
	if n := tb.expire(65); n != 1 || tb.len() != 1 {
		t.Fatalf("expired %d, %d left", n, tb.len())
	}
}

// TestRememberedDropsCheapest fills one bucket pair (a table of one
// bucket) and checks what makes room: a fresh record, then the part-used
// record with the least used, then the exhausted one fresh soonest, and
// never a record that costs more than the new one.
func TestRememberedDropsCheapest(t *testing.T) {
	tb := newRemembered(bucketSlots)
	if tb.capacity() != bucketSlots {
		t.Fatalf("capacity %d", tb.capacity())
	}
	const now = 100
	for i := range uint64(bucketSlots) {
		tb.put(rec(i+1, int64(1000+i), uint8(10+i)), now) // part used, costs 10..17
	}
	tb.put(rec(1, 150, 10), now) // key 1 again: replaced, fresh at 150
	// Fresh records go first, at no cost.
	if _, full := tb.put(rec(100, 5000, 0), 200); full {
		t.Fatal("a fresh record was not reused")
	}
	// Full: the new cheapest record is itself dropped.
	if d, full := tb.put(rec(101, 4000, 0), 200); !full || d.hash != 101 {
		t.Fatalf("dropped %+v, %v; want the new record", d, full)
	}
	// An exhausted one drops the cheapest part-used one, key 100 (cost 0),
	// then key 2 (cost 11), and so on.
	for i, want := range []uint64{100, 2, 3, 4, 5, 6, 7, 8} {
		d, full := tb.put(rec(uint64(200+i), int64(3000+i), costExhausted), 200)
		if !full || d.hash != want {
			t.Fatalf("exhausted record %d dropped %+v, want key %d", i, d, want)
		}
	}
	// All exhausted: the one fresh soonest goes, the new one if it is.
	if d, _ := tb.put(rec(300, 2000, costExhausted), 200); d.hash != 300 {
		t.Fatalf("dropped %+v, want the new record (fresh soonest)", d)
	}
	if d, _ := tb.put(rec(301, 4000, costExhausted), 200); d.hash != 200 {
		t.Fatalf("dropped %+v, want key 200 (fresh at 3000)", d)
	}
	if tb.droppedPart.Load() != 9 || tb.droppedSpent.Load() != 2 || tb.len() != bucketSlots {
		t.Fatalf("dropped %d part used, %d exhausted; %d held", tb.droppedPart.Load(), tb.droppedSpent.Load(), tb.len())
	}
}

// TestRememberedFillsEvenly puts records of random hashes into tables of
// the default capacity and of a small one (one shard) until one finds no
// room: two choices of bucket and relocation keep them even, so that happens
// only when the table is nearly full. The store documents that evictions of
// up to 96 % of --remembered-keys live keys lose none.
func TestRememberedFillsEvenly(t *testing.T) {
	for _, capacity := range []int{20_000, DefaultRememberedKeys} {
		tb := newRemembered(capacity)
		rng := rand.New(rand.NewPCG(1, 2))
		n := 0
		for {
			if _, full := tb.put(rec(rng.Uint64(), 1000, costExhausted), 1); full {
				break
			}
			n++
		}
		load := float64(n) / float64(tb.capacity())
		t.Logf("first drop after %d records: %.4f of %d in %d shards", n, load, tb.capacity(), len(tb.shards))
		if load < 0.96 {
			t.Fatalf("first drop at %.4f of the capacity %d, want at least 0.96", load, tb.capacity())
		}
	}
}

// TestCostOf checks the share of a limit used, as costOf ranks part-used
// keys, for small and huge limits.
func TestCostOf(t *testing.T) {
	for _, c := range []struct {
		limit, remaining uint64
		want             uint8
	}{
		{10, 10, 0}, {10, 9, 3}, {10, 1, 27}, {10, 0, 30}, {10, 20, 0}, {0, 0, 0},
		{1 << 40, 1 << 39, 15}, {1 << 40, 1<<40 - 1, 1}, {math.MaxUint64, 0, 30}, {1000, 999, 1},
	} {
		if got := costOf(scaled(c.limit, c.remaining)); got != c.want {
			t.Errorf("limit %d, remaining %d: cost %d, want %d", c.limit, c.remaining, got, c.want)
		}
	}
}
