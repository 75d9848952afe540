package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// DefaultCloseWriteBack bounds how long Close writes back the hits still
// waiting when Options.CloseWriteBack is zero.
const DefaultCloseWriteBack = 5 * time.Second

// drain writes back the hits still waiting when the store closes (allowed
// while Redis was away), for at most d: it sends them as the flush loop
// does, once Redis answers a PING, and tries again every WriteBackInterval
// while Redis does not answer or a write-back fails. What is still waiting
// after d (Redis stayed away) is dropped, counted in
// Stats.WriteBackDroppedAtClose, and named in the error returned.
func (r *Store) drain(d time.Duration) error {
	if r.wb.pending() == 0 {
		return nil
	}
	if d > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		for r.wb.pending() > 0 && ctx.Err() == nil {
			if r.flush(ctx, ctx) || r.wb.pending() == 0 {
				continue
			}
			select {
			case <-ctx.Done():
			case <-time.After(WriteBackInterval):
			}
		}
	}
	keys, hits := r.wb.drop()
	if keys == 0 {
		return nil
	}
	r.wb.droppedAtClose.Add(hits)
	return fmt.Errorf("redis: %d hits of %d keys allowed without Redis were not written back: Redis did not take them within %v of closing", hits, keys, max(d, 0))
}

// WriteBackPending returns the keys whose hits wait to be written back, or
// are being written (Stats.WriteBackPending).
func (r *Store) WriteBackPending() int { return r.wb.pending() }

// drop empties the buffer and returns the keys and hits it held.
func (w *writeBack) drop() (keys int, hits uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, it := range w.keys {
		keys++
		hits += it.Hits
		delete(w.keys, k)
	}
	return keys, hits
}

// unsent resolves calls that the closing store will never send, as not
// charged: a caller still waiting gets backend.ErrClosed, and the fallback's
// decision of a caller that left is written back (see Store.degrade).
func (r *Store) unsent(calls []*call) {
	for _, c := range calls {
		c.err = backend.ErrClosed
		c.finish(notCharged)
	}
}

// unsentQueued resolves the calls still waiting for a pipeline when the
// store closed (see unsent), and makes enqueue refuse new ones. Close calls
// it once the workers have returned.
func (r *Store) unsentQueued() {
	r.mu.Lock()
	r.stopped = true
	calls := r.pending
	r.pending, r.pendingCmds = nil, 0
	r.mu.Unlock()
	r.unsent(calls)
}
