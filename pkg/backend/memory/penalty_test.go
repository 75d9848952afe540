package memory

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// checkHeap fails the test unless p's heap is ordered and its index agrees.
func checkHeap(t *testing.T, p *penalties) {
	t.Helper()
	if len(p.idx) != len(p.heap) || p.len() != len(p.heap) {
		t.Fatalf("index %d, heap %d, len %d", len(p.idx), len(p.heap), p.len())
	}
	used := 0
	for _, r := range p.heap {
		used += units(&r.state)
	}
	if used != p.used || used > p.capacity {
		t.Fatalf("records take %d units, counted %d, capacity %d", used, p.used, p.capacity)
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

// TestPenaltiesWeighLogs checks that a sliding log's record takes the room of
// its log: the set's memory stays within its records' share.
func TestPenaltiesWeighLogs(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Requests: 1000, Window: time.Hour}
	var log algorithms.State
	for i := range int64(1000) {
		log, _ = algorithms.DecideMicros(l, log, i+1, 1)
	}
	w := units(&log) // 1,024 slots of 16 bytes: 1 + 127
	if w != 1+(1024*16+PenaltyRecordBytes-1)/PenaltyRecordBytes {
		t.Fatalf("a log of %d bytes takes %d units", log.HeapBytes(), w)
	}
	small := newPenalties(w - 1)
	small.put(1, log, 100, 0)
	if small.len() != 0 || small.dropped.Load() != 1 {
		t.Fatalf("a log larger than the whole set was kept: %d records", small.len())
	}
	p := newPenalties(w + 10)
	for h := range uint64(10) {
		p.put(h, algorithms.State{}, int64(200+h), 0)
	}
	p.put(99, log, 300, 0) // fits exactly
	checkHeap(t, p)
	if p.len() != 11 {
		t.Fatalf("%d records, want 11", p.len())
	}
	p.put(100, algorithms.State{}, 400, 0) // makes room: drops the soonest
	checkHeap(t, p)
	if _, _, ok := p.take(0); ok || p.len() != 11 {
		t.Fatalf("the soonest record was kept (%d records)", p.len())
	}
	p.put(101, log, 500, 0) // the log's room again: drops records fresh before 500
	checkHeap(t, p)
	if _, _, ok := p.take(99); ok {
		t.Fatal("the older log (fresh at 300) was kept beside the new one")
	}
	if _, _, ok := p.take(101); !ok {
		t.Fatal("the new log was dropped")
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
