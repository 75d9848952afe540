package algorithms

// logEntry is one allowed request of a sliding window log.
type logEntry struct {
	at   int64 // µs
	hits uint64
}

// ring is a FIFO of log entries over a circular buffer whose length is a
// power of two (so that indices wrap with a mask). It is a value: copies
// share the buffer, and dropOldest and push change only the copy they are
// called on. dropOldest only moves the head, and push writes only to a
// slot outside both the view and the kept slots (see keep), or into a new
// buffer, so older ring values whose entries lie there stay valid after newer
// ones are derived from them.
type ring struct {
	buf  []logEntry
	head int // slot of the oldest entry
	n    int // number of entries
	// keep is the number of slots just before head that an older ring of the
	// same lineage may still use: the entries dropped since the ring that a
	// caller may go back to. push never writes there.
	keep int
}

func (r ring) at(i int) logEntry { return r.buf[(r.head+i)&(len(r.buf)-1)] }

func (r ring) oldest() logEntry { return r.at(0) }

func (r ring) newest() logEntry { return r.at(r.n - 1) }

// dropOldest removes the oldest entry from the view; its slot is kept.
func (r *ring) dropOldest() {
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	r.keep++
}

// push appends e. It writes in place when a slot outside the view and the
// kept slots is free; otherwise the entries move to a new buffer of at least
// twice their number (a power of two, at least 4), with nothing kept.
func (r *ring) push(e logEntry) {
	if r.keep+r.n >= len(r.buf) {
		size := 4
		for size < 2*r.n {
			size *= 2
		}
		buf := make([]logEntry, size)
		for i := 0; i < r.n; i++ {
			buf[i] = r.at(i)
		}
		*r = ring{buf: buf, n: r.n}
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = e
	r.n++
}

// logEntryBytes is the size of one logEntry in a ring's buffer.
const logEntryBytes = 16

// HeapBytes returns the bytes s holds outside its own struct: the buffer of
// a sliding window log (16 bytes per slot), zero for the other algorithms.
// A store that bounds its memory weighs a key with it.
func (s State) HeapBytes() int { return cap(s.log.buf) * logEntryBytes }
