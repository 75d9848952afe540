package redis

// Consistency lease (backend.Lease): chunks of a limit reserved in Redis
// and decided from memory. Until they land, newLease returns none and
// lease items are decided strict, in Redis.

// newLease returns the local path of consistency lease, nil for none.
func (r *Store) newLease(opts Options) (localPath, error) { return nil, nil }
