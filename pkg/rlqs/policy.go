package rlqs

import (
	"math"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// kind is how a bucket's limit is handed to the Envoys that share it.
type kind uint8

const (
	// allowAll: no limit applies (unlimited, shadow mode, a descriptor
	// without limits, or an unmatched bucket under the default).
	allowAll kind = iota
	// denyAll: requests_per_unit 0, or an unmatched bucket under
	// --rlqs-unmatched deny_all.
	denyAll
	// rateKind: the limit is a rate and a burst (token_bucket and gcra,
	// and windowed algorithms with windows shorter than BudgetWindow):
	// the Envoys share the rate; each gets a burst in proportion.
	rateKind
	// budgetKind: a windowed limit of BudgetWindow or longer: what is left
	// of the window's budget, spread over what is left of the window.
	budgetKind
)

// BudgetWindow is the shortest window enforced as a remaining budget
// (fixed_window, sliding_window_log and sliding_window_counter limits of a
// minute or longer): what the window has left (its counter, which RLS
// shares) spread over what is left of it. Shorter windows are a rate.
const BudgetWindow = time.Minute

// policy is what one matched bucket is limited by: the tightest enforced
// limit of its descriptor, as a rate and a burst, and every enforced limit's
// counter (the ledger RLS decides on).
type policy struct {
	kind kind
	// rate is the limit's long-run rate in requests per second (for a
	// budget, requests_per_unit over the window), burst the most it allows
	// at once (a window's count, or a bucket's capacity).
	rate  float64
	burst float64
	// limit is the tightest limit; sliding reports a budget over a sliding
	// window (what is left replenishes as the window slides, so it is
	// spread over a whole window).
	limit   algorithms.Limit
	sliding bool
	// key identifies the bucket among all instances: the tightest limit's
	// counter key.
	key string
	// tight is the index in ledger of the tightest limit.
	tight int
	// ledger holds one item per enforced limit of the descriptor (Hits and
	// Account are set per charge).
	ledger []backend.Item
	// statsKey labels the bucket's metrics (the rule metrics' key).
	statsKey string
	domain   string
}

// rateOf returns a limit's rate (requests per second) and burst as the
// RLQS shares see it, and whether it is a budget.
func rateOf(l algorithms.Limit) (rate, burst float64, budget bool) {
	rate = float64(l.Requests) / l.Window.Seconds()
	if l.Algorithm.HasBurst() {
		return rate, float64(l.Capacity()), false
	}
	return rate, float64(l.Requests), l.Window >= BudgetWindow
}

// policyFor turns the descriptor a bucket matched (path, with the
// bucket's entries in path order) into its policy. unmatched is the kind of
// a bucket no descriptor limits.
func policyFor(domain string, entries []descriptors.Entry, path []*descriptors.Node) policy {
	n := path[len(path)-1]
	p := policy{kind: allowAll, domain: domain, statsKey: n.StatsKey(entries)}
	if n.ShadowMode {
		return p
	}
	tightest := math.Inf(1)
	for _, l := range n.Limits {
		if l.Unlimited {
			return policy{kind: allowAll, domain: domain, statsKey: p.statsKey}
		}
		if l.Shadow {
			continue
		}
		key, part := rls.CounterKey(domain, entries, path, l.ID)
		p.ledger = append(p.ledger, backend.Item{Key: key, Limit: l.Limit, Partition: part, Mode: backend.Enforced, Account: true})
		if l.Limit.Requests == 0 {
			p.kind, p.key, p.tight, p.limit = denyAll, key, len(p.ledger)-1, l.Limit
			tightest = 0
			continue
		}
		rate, burst, budget := rateOf(l.Limit)
		if rate < tightest || (rate == tightest && burst < p.burst) {
			tightest = rate
			p.kind, p.rate, p.burst, p.limit = rateKind, rate, burst, l.Limit
			p.key, p.tight = key, len(p.ledger)-1
			p.sliding = false
			if budget {
				p.kind = budgetKind
				p.sliding = l.Limit.Algorithm != algorithms.FixedWindow
			}
		}
	}
	if len(p.ledger) == 0 {
		p.kind = allowAll // every limit shadowed, or none
	}
	return p
}
