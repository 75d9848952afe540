package redis

// Consistency approximate (backend.Approximate): its local path plugs in
// here. Until it does, newApproximate returns none and approximate items
// are decided strict, in Redis (see consistency.go for the routing and
// localPath for what a path implements).

// newApproximate returns the local path of consistency approximate, nil
// for none (its items are then strict).
func (r *Store) newApproximate(opts Options) (localPath, error) { return nil, nil }
