package rls

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Counter keys.
//
// A key is length-prefixed fields:
//
//	<len>:<domain><len>:<key1><len>:<value1>...<len>:<limit id>
//
// where each <len> is the decimal byte length of the field after the colon.
// Length prefixes make the encoding unambiguous whatever bytes the values hold:
// the reference server's `domain_key_value_` joins let (b_c, d) and (b, c_d)
// share a counter; here they cannot. The limit's counter identity ends the
// key (descriptors.CounterID: its algorithm and window, and its place among
// the descriptor's limits of that algorithm and window), so two limits on
// one descriptor never share state. The count (requests_per_unit, burst) is
// not in the key: usage belongs to the descriptor, so a reload or a request
// override that changes the count applies it to what was already used; a
// change of algorithm or window starts a fresh counter.
//
// Every limit of one descriptor is in one partition (backend.Item.Partition):
// the xxhash64 of the descriptor part (domain and entries), never zero. The
// store decides a partition in one atomic step (the Redis store derives a
// Cluster hash tag from it). Partitions of different descriptors may collide;
// that only places them together, which is harmless.

// keyBuilder builds counter keys into a reusable buffer.
type keyBuilder struct {
	buf       []byte
	desc      int    // length of the descriptor part
	partition uint64 // of the descriptor part, set by seal
}

// reset starts the descriptor part of a key for domain.
func (b *keyBuilder) reset(domain string) {
	b.buf = b.buf[:0]
	b.field(domain)
}

// entry adds one descriptor entry.
func (b *keyBuilder) entry(key, value string) {
	b.field(key)
	b.field(value)
}

// seal computes the partition of the descriptor part; call it after the
// last entry and before key.
func (b *keyBuilder) seal() {
	b.partition = max(xxhash.Sum64(b.buf), 1)
	b.desc = len(b.buf)
}

// key returns the full key for a limit identified by id.
func (b *keyBuilder) key(id string) string {
	b.buf = b.buf[:b.desc]
	b.field(id)
	return string(b.buf)
}

func (b *keyBuilder) field(s string) {
	b.buf = strconv.AppendInt(b.buf, int64(len(s)), 10)
	b.buf = append(b.buf, ':')
	b.buf = append(b.buf, s...)
}
