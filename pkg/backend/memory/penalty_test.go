package memory

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// checkHeap fails the test unless p's heap is ordered and its index agrees.
func checkHeap(t *testing.T, p *penalties) {
	t.Helper()
	if len(p.idx) != len(p.heap) || p.len() != len(p.heap) {
		t.Fatalf("index %d, heap %d, len %d", len(p.idx), len(p.heap), p.len())
	}
	for i, r := range p.heap {
		if p.idx[r.hash] != i {
			t.Fatalf("record %d at %d, index says %d", r.hash, i, p.idx[r.hash])
		}
		if i > 0 && p.heap[(i-1)/2].until > r.until {
			t.Fatalf("heap out of order at %d", i)
		}
	}
}

func TestPenaltiesFullDropsSoonest(t *testing.T) {
	p := newPenalties(3)
	var s algorithms.State
	p.put(1, s, 300, 0)
	p.put(2, s, 100, 0)
	p.put(3, s, 200, 0)
	checkHeap(t, p)
	// Full: a record fresh sooner than every held one is dropped itself.
	p.put(4, s, 50, 0)
	if _, _, ok := p.take(4); ok {
		t.Fatal("record 4 (the soonest) was kept in a full set")
	}
	// A later one replaces the soonest (2, at 100).
	p.put(5, s, 400, 0)
	checkHeap(t, p)
	if _, _, ok := p.take(2); ok {
		t.Fatal("record 2 (the soonest) was kept")
	}
	if p.dropped.Load() != 2 {
		t.Fatalf("dropped %d, want 2", p.dropped.Load())
	}
	for _, h := range []uint64{1, 3, 5} {
		if _, _, ok := p.take(h); !ok {
			t.Fatalf("record %d lost", h)
		}
		checkHeap(t, p)
	}
	if p.len() != 0 || p.restored.Load() != 3 {
		t.Fatalf("len %d restored %d", p.len(), p.restored.Load())
	}
}

func TestPenaltiesReplaceAndExpire(t *testing.T) {
	p := newPenalties(100)
	var s algorithms.State
	for i := range uint64(50) {
		p.put(i, s, int64(1000-i*10), 0) // 1000, 990, ... 510
	}
	checkHeap(t, p)
	p.put(7, s, 5000, 0) // a key evicted again: its record is replaced
	checkHeap(t, p)
	if _, until, ok := p.take(7); !ok || until != 5000 {
		t.Fatalf("replaced record: until %d ok %v", until, ok)
	}
	// Records fresh at 800 or earlier go: 510..800 is 30 records.
	if n := p.expire(800); n != 30 {
		t.Fatalf("expired %d, want 30", n)
	}
	checkHeap(t, p)
	if p.len() != 19 {
		t.Fatalf("%d records left, want 19", p.len())
	}
	// An insert drops what is fresh at its instant too.
	p.put(99, s, 2000, 900)
	checkHeap(t, p)
	if p.len() != 10 { // 910..1000 and the new one
		t.Fatalf("%d records left, want 10", p.len())
	}
}

// BenchmarkPenaltyBytes measures the memory of one penalty record of a
// fixed-size state (compare PenaltyRecordBytes).
func BenchmarkPenaltyBytes(b *testing.B) {
	const n = 100_000
	var perRecord float64
	for b.Loop() {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		p := newPenalties(n)
		for i := range uint64(n) {
			p.put(hashKey(strconv.FormatUint(i, 10)), algorithms.State{}, int64(i+1), 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		perRecord = float64(ms.HeapAlloc-before) / n
		runtime.KeepAlive(p)
	}
	b.ReportMetric(perRecord, "B/record")
}
