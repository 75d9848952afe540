package storetest

import (
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Model is the Store contract at its plainest: backend.Transact over a map
// of states. Stores compare themselves with it on random requests.
type Model map[string]algorithms.State

// Apply decides items as one request at now, as Store.Apply does, and keeps
// the charges when the request is allowed.
func (m Model) Apply(items []backend.Item, now time.Time) ([]algorithms.Decision, bool) {
	tx, keys := NewTxn(items, func(key string) algorithms.State { return m[key] })
	out := make([]algorithms.Decision, len(items))
	allowed := backend.Transact(tx, items, now.UnixMicro(), backend.WholeRequest, out)
	for j, k := range keys {
		if tx.Charged[j] {
			m[k] = tx.Next[j]
		}
	}
	return out, allowed
}

// NewTxn returns the working space of backend.Transact for items, with each
// distinct key's stored state read by load, and the distinct keys in the
// order of their first items.
func NewTxn(items []backend.Item, load func(key string) algorithms.State) (*backend.Txn, []string) {
	index := map[string]int{}
	var keys []string
	tx := &backend.Txn{KeyOf: make([]int, len(items))}
	for i, it := range items {
		j, ok := index[it.Key]
		if !ok {
			j = len(keys)
			index[it.Key] = j
			keys = append(keys, it.Key)
			s := load(it.Key)
			tx.Stored = append(tx.Stored, &s)
		}
		tx.KeyOf[i] = j
	}
	tx.Next = make([]algorithms.State, len(keys))
	tx.Charged = make([]bool, len(keys))
	tx.ResetAfter = make([]time.Duration, len(keys))
	return tx, keys
}
