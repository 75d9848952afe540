package backend

import (
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// The transaction of a request, written once: Transact is what every store
// does between reading the states of a request's keys and writing them back.
// The memory store locks the entries, calls it and writes back; the stores'
// test models are Transact over a map. The Redis store's script
// (pkg/backend/redis/lua/*.lua, joined into one) is its Lua twin: the same
// decisions in the same order, with the same outcome, but it charges the
// states in place and keeps an undo log of the keys a request changed,
// which it rolls back (newest first) when the request does not commit,
// where Transact charges copies (Next) and starts them again from Stored.

// Commit says when the charges of a transaction are kept.
type Commit uint8

const (
	// WholeRequest: the items are a whole request, and the charges are kept
	// when the request is allowed (see Verdict).
	WholeRequest Commit = iota
	// PartOfRequest: the items are one part of a request that is decided in
	// several transactions (one per Redis Cluster slot). No part sees the
	// others' decisions, so a part keeps its charges unless one of its own
	// Enforced items denies.
	PartOfRequest
)

// Txn is the working space of Transact for the distinct keys of one request,
// provided by the caller so that Transact allocates nothing. Stored, Next,
// Charged and ResetAfter have one element per distinct key.
type Txn struct {
	// KeyOf[i] is the index of item i's key among the distinct keys.
	KeyOf []int
	// Stored[j] points to key j's state as the store holds it (so a store
	// need not copy it). Transact does not change it.
	Stored []*algorithms.State
	// Next[j] is, on return, key j's state after the items that allowed.
	Next []algorithms.State
	// Charged[j] reports, on return, that an item of key j allowed, so Next[j]
	// is to be written when Transact commits.
	Charged []bool
	// ResetAfter[j] is, on return, the ResetAfter of the last allowing item
	// of key j: how long until Next[j] is fresh (a full limit) again.
	ResetAfter []time.Duration
}

// Transact decides items together at the instant now (µs since the Unix
// epoch) against tx.Stored, writes one decision per item into out, and
// reports whether the charges commit: then every key with tx.Charged is to
// be written as tx.Next. Items are decided in order, and an item sees the
// hits of the allowing items of its key before it.
//
// With WholeRequest, Transact commits exactly when Verdict allows the
// request; with PartOfRequest, unless an Enforced item denies. When it does
// not commit, only usage accounting (Item.Account) is charged, and every
// other item that allowed reports instead its key's state as it stays (see
// Report); a denying item keeps its own decision. Either way, on return
// every key with tx.Charged is to be written as tx.Next.
//
// Transact allocates nothing (Verdict allocates only for Quota groups
// outside 0..63).
func Transact(tx *Txn, items []Item, now int64, c Commit, out []algorithms.Decision) bool {
	for j, s := range tx.Stored {
		tx.Next[j] = *s
	}
	clear(tx.Charged)
	for i := range items {
		// In place: Next[j] changes only when the hits are charged.
		j, it := tx.KeyOf[i], &items[i]
		if it.Account && it.Hits > 0 {
			d := algorithms.AccountInPlace(&it.Limit, &tx.Next[j], now, it.Hits)
			out[i] = d
			tx.ResetAfter[j], tx.Charged[j] = d.ResetAfter, true
			continue
		}
		d := algorithms.DecideInPlace(&it.Limit, &tx.Next[j], now, it.Hits)
		out[i] = d
		if d.Allowed {
			tx.ResetAfter[j], tx.Charged[j] = d.ResetAfter, true
		}
	}
	var commit bool
	if c == WholeRequest {
		commit = Verdict(items, out[:len(items)])
	} else {
		commit = !enforcedDenies(items, out)
	}
	if !commit {
		uncharge(tx, items, now, out)
	}
	return commit
}

// uncharge is the end of a transaction that does not commit: only usage
// accounting is charged, again from the stored states (its decisions stay
// the ones the verdict was made of), and the allowing items report their
// key's state as it stays. Apart from Transact, whose common path then
// needs no room on its stack for the copies of states made here.
func uncharge(tx *Txn, items []Item, now int64, out []algorithms.Decision) {
	for j, s := range tx.Stored {
		tx.Next[j] = *s
	}
	clear(tx.Charged)
	for i := range items {
		j, it := tx.KeyOf[i], &items[i]
		switch {
		case it.Account && it.Hits > 0:
			d := algorithms.AccountInPlace(&it.Limit, &tx.Next[j], now, it.Hits)
			tx.ResetAfter[j], tx.Charged[j] = d.ResetAfter, true
		case out[i].Allowed:
			_, d := algorithms.DecideMicros(it.Limit, tx.Next[j], now, 0)
			out[i] = Report(d)
		}
	}
}

// enforcedDenies reports whether an Enforced item denies.
func enforcedDenies(items []Item, ds []algorithms.Decision) bool {
	for i := range items {
		if items[i].Mode == Enforced && !ds[i].Allowed {
			return true
		}
	}
	return false
}
