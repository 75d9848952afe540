package algorithms

import (
	"testing"
	"time"
	"unsafe"
)

func entries(r ring) []logEntry {
	var es []logEntry
	for i := 0; i < r.n; i++ {
		es = append(es, r.at(i))
	}
	return es
}

func sameEntries(a, b []logEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRingKeepsOlderViews drives the ring directly: it grows in powers of
// two, wraps around in place, and never writes into the view or the kept
// slots of the ring it was derived from.
func TestRingKeepsOlderViews(t *testing.T) {
	var r ring
	for i := int64(0); i < 5; i++ {
		r.push(logEntry{at: i, hits: 1})
	}
	if len(r.buf) != 8 || r.n != 5 || r.keep != 0 {
		t.Fatalf("after 5 pushes: len %d, n %d, keep %d", len(r.buf), r.n, r.keep)
	}
	// Drop 3, push 5: wraps around in place (3 kept + 2 live + 3 new = 8).
	base := r
	baseEntries := entries(base)
	for i := 0; i < 3; i++ {
		r.dropOldest()
	}
	buf := &r.buf[0]
	for i := int64(5); i < 8; i++ {
		r.push(logEntry{at: i, hits: 1})
	}
	if &r.buf[0] != buf {
		t.Fatal("pushing into free slots reallocated")
	}
	if !sameEntries(entries(base), baseEntries) {
		t.Fatalf("the older ring changed: %v, was %v", entries(base), baseEntries)
	}
	// Every free slot is now kept for base: the next push moves to a new buffer.
	derived := r
	r.push(logEntry{at: 8, hits: 1})
	if &r.buf[0] == buf || len(r.buf) != 16 || r.keep != 0 {
		t.Fatalf("push with no free slot: len %d, keep %d, same buffer %v", len(r.buf), r.keep, &r.buf[0] == buf)
	}
	if !sameEntries(entries(base), baseEntries) {
		t.Fatalf("the older ring changed: %v, was %v", entries(base), baseEntries)
	}
	want := []logEntry{{3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {8, 1}}
	if !sameEntries(entries(r), want) {
		t.Fatalf("entries %v, want %v", entries(r), want)
	}
	if !sameEntries(entries(derived), want[:5]) {
		t.Fatalf("derived ring changed: %v", entries(derived))
	}

	// Without kept slots (a new instant), the same drops free their slots
	// for reuse: the ring wraps in place.
	r = ring{}
	for i := int64(0); i < 4; i++ {
		r.push(logEntry{at: i, hits: 1})
	}
	buf = &r.buf[0]
	for i := int64(4); i < 40; i++ {
		r.keep = 0
		r.dropOldest()
		r.keep = 0
		r.push(logEntry{at: i, hits: 1})
		if &r.buf[0] != buf {
			t.Fatalf("push %d reallocated a ring with a free slot", i)
		}
	}
	if want := []logEntry{{36, 1}, {37, 1}, {38, 1}, {39, 1}}; !sameEntries(entries(r), want) {
		t.Fatalf("entries %v, want %v", entries(r), want)
	}
}

// TestHeapBytes checks the size HeapBytes counts per log slot, and that it
// follows the log's buffer.
func TestHeapBytes(t *testing.T) {
	if got := unsafe.Sizeof(logEntry{}); got != logEntryBytes {
		t.Fatalf("logEntry is %d bytes, HeapBytes counts %d", got, logEntryBytes)
	}
	l := Limit{Algorithm: SlidingWindowLog, Requests: 100, Window: time.Minute}
	var s State
	if s.HeapBytes() != 0 {
		t.Fatalf("fresh state holds %d bytes", s.HeapBytes())
	}
	for i := range 10 {
		s, _ = DecideMicros(l, s, int64(i+1), 1)
	}
	if got, want := s.HeapBytes(), cap(s.log.buf)*logEntryBytes; got != want || got < 10*logEntryBytes {
		t.Fatalf("HeapBytes %d after 10 logged requests, want %d (at least %d)", got, want, 10*logEntryBytes)
	}
	b, _ := DecideMicros(Limit{Algorithm: TokenBucket, Requests: 10, Window: time.Second}, State{}, 1, 1)
	if b.HeapBytes() != 0 {
		t.Fatalf("token bucket state holds %d bytes", b.HeapBytes())
	}
}
