package algorithms

// logEntry is one allowed request of a sliding window log.
type logEntry struct {
	at   int64 // µs
	hits uint64
}

// ring is a FIFO of log entries over a circular buffer. It is a value: copies
// share the buffer. dropOldest only moves the head, and push writes only to a
// slot outside the view of the ring it was derived from (or into a new buffer),
// so an older ring value stays valid after a newer one is derived from it.
type ring struct {
	buf  []logEntry
	head int
	n    int
}

func (r ring) at(i int) logEntry { return r.buf[(r.head+i)%len(r.buf)] }

func (r ring) oldest() logEntry { return r.at(0) }

func (r ring) newest() logEntry { return r.at(r.n - 1) }

func (r ring) dropOldest() ring {
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return r
}

// push appends e to r. base is the ring r was derived from by dropOldest
// calls (or r itself): the slot after base's newest entry is free in both.
// When base fills the buffer, the entries of r move to a new, larger buffer.
func (r ring) push(base ring, e logEntry) ring {
	if base.n >= len(base.buf) || len(r.buf) == 0 {
		size := 2 * len(r.buf)
		if size < 4 {
			size = 4
		}
		buf := make([]logEntry, size)
		for i := 0; i < r.n; i++ {
			buf[i] = r.at(i)
		}
		r = ring{buf: buf, n: r.n}
	}
	r.buf[(r.head+r.n)%len(r.buf)] = e
	r.n++
	return r
}
