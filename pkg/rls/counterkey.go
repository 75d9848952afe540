package rls

import "github.com/envoyrls/envoy-rls/pkg/descriptors"

// CounterKey returns the counter key of the limit identified by id (a
// descriptors.RateLimit's ID) for a request descriptor of domain with
// entries, which Match (or MatchBucket, for an RLQS bucket) resolved to
// path, and the key's partition (backend.Item.Partition): the key a
// ShouldRateLimit call with these entries charges. The RLQS service uses it
// to keep one ledger with the RLS service.
func CounterKey(domain string, entries []descriptors.Entry, path []*descriptors.Node, id string) (key string, partition uint64) {
	var b keyBuilder
	b.reset(domain)
	for j, e := range entries {
		v := e.Value
		if j < len(path) {
			v = path[j].CounterValue(v)
		}
		b.entry(e.Key, v)
	}
	b.seal()
	return b.key(id), b.partition
}
