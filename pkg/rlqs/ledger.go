package rlqs

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// One ledger with RLS. The counters a bucket's descriptor has in the store
// RLS decides on are charged with what RLQS hands out, so that a domain
// served by both protocols stays within its limit:
//
//   - a rate (token_bucket, gcra, windows under a minute) is charged, every
//     second, the rates this instance assigned (and, once, the burst of a
//     token bucket Envoy starts full): RLS gets what RLQS does not hold;
//   - a budget (a window of a minute or more) is charged the requests the
//     Envoys report as allowed, and what its counter has left is the
//     capacity the Envoys share: RLS and RLQS spend one budget.

// bucketAgg is what this instance assigned in one bucket, by stream.
type bucketAgg struct {
	pol       policy
	label     string             // the bucket label of its metrics
	rates     map[string]float64 // by stream: assigned rate
	demand    map[string]float64 // by stream: measured demand
	departing []departing        // rates of ended streams, held until their TTL
	burst     float64            // tokens of full starts not charged yet
	carry     float64            // fraction of a hit not charged yet
}

type departing struct {
	rate  float64
	until time.Time
}

// total returns the rate this instance has out at t.
func (a *bucketAgg) total(t time.Time) float64 {
	r := 0.0
	for _, v := range a.rates {
		r += v
	}
	kept := a.departing[:0]
	for _, d := range a.departing {
		if t.Before(d.until) {
			r += d.rate
			kept = append(kept, d)
		}
	}
	a.departing = kept
	return r
}

func (s *Service) aggSet(st *stream, sb *sub, rate float64) {
	s.aggMu.Lock()
	defer s.aggMu.Unlock()
	a := s.aggs[sb.pol.key]
	if a == nil {
		a = &bucketAgg{pol: sb.pol, label: s.m.bucketLabel(sb.pol), rates: map[string]float64{}, demand: map[string]float64{}}
		s.aggs[sb.pol.key] = a
	}
	a.rates[st.id] = rate
	a.demand[st.id] = max(sb.demand, 0)
}

func (s *Service) aggDepart(st *stream, key string, rate float64, until time.Time) {
	s.aggMu.Lock()
	defer s.aggMu.Unlock()
	a := s.aggs[key]
	if a == nil {
		return
	}
	delete(a.rates, st.id)
	delete(a.demand, st.id)
	if rate > 0 {
		a.departing = append(a.departing, departing{rate, until})
	}
}

func (s *Service) aggBurst(key string, tokens float64) {
	s.aggMu.Lock()
	defer s.aggMu.Unlock()
	if a := s.aggs[key]; a != nil {
		a.burst += tokens
	}
}

// ledgerInterval is how often assigned rates are charged to the ledger.
const ledgerInterval = time.Second

// ledgerLoop charges the assigned rates every ledgerInterval and drops
// what nobody holds any more, until the service shuts down.
func (s *Service) ledgerLoop() {
	defer close(s.done)
	every := s.o.LedgerInterval
	if every < 0 {
		<-s.closing
		return
	}
	if every == 0 {
		every = ledgerInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last := s.now()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		now := s.now()
		s.chargeRates(now, now.Sub(last))
		last = now
		if sw, ok := s.shares.(interface{ Sweep() }); ok {
			sw.Sweep()
		}
	}
}

// chargeRates charges every rate bucket the hits its assigned rates are
// worth over dt (and pending full starts); buckets with nothing out are
// forgotten.
func (s *Service) chargeRates(now time.Time, dt time.Duration) {
	var calls [][]backend.Item
	s.aggMu.Lock()
	for k, a := range s.aggs {
		r := a.total(now)
		if r == 0 && len(a.rates) == 0 && len(a.departing) == 0 {
			delete(s.aggs, k)
			continue
		}
		if a.pol.kind != rateKind || s.o.Ledger == nil {
			a.burst = 0
			continue
		}
		hits := a.carry + r*dt.Seconds() + a.burst
		n := math.Floor(hits)
		a.carry, a.burst = hits-n, 0
		if n < 1 {
			continue
		}
		items := make([]backend.Item, len(a.pol.ledger))
		copy(items, a.pol.ledger)
		for i := range items {
			items[i].Hits = uint64(n)
		}
		calls = append(calls, items)
	}
	s.aggMu.Unlock()
	if len(calls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ledgerInterval)
	defer cancel()
	s.applyAll(ctx, calls, nil)
}

// ledgerWorkers bounds the ledger calls in flight at once.
const ledgerWorkers = 32

// applyAll runs one Apply per call, ledgerWorkers at a time, and writes
// each call's decisions to out[i] (when out is not nil). A failed call
// leaves out[i] nil.
func (s *Service) applyAll(ctx context.Context, calls [][]backend.Item, out [][]algorithms.Decision) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(ledgerWorkers, len(calls)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ds := make([]algorithms.Decision, len(calls[i]))
				if _, err := s.o.Ledger.Apply(ctx, calls[i], ds); err != nil {
					s.m.ledgerError()
					s.logLedger(err)
					continue
				}
				if out != nil {
					out[i] = ds
				}
			}
		}()
	}
	for i := range calls {
		next <- i
	}
	close(next)
	wg.Wait()
}

// capacities returns each sub's capacity (requests per second): its
// limit's rate, or for a budget what its counter has left spread over what
// is left of the window (at least a report period), after charging the
// requests reported as allowed.
func (s *Service) capacities(ctx context.Context, work []*sub, period time.Duration) []float64 {
	caps := make([]float64, len(work))
	var calls [][]backend.Item
	var idx []int
	for i, sb := range work {
		caps[i] = sb.pol.rate
		if sb.pol.kind != budgetKind {
			sb.unused = 0
			continue
		}
		if sb.capacity > 0 {
			caps[i] = sb.capacity
		}
		if s.o.Ledger == nil {
			sb.unused = 0
			continue
		}
		items := make([]backend.Item, len(sb.pol.ledger))
		copy(items, sb.pol.ledger)
		for j := range items {
			items[j].Hits = sb.unused
		}
		sb.unused = 0
		calls = append(calls, items)
		idx = append(idx, i)
	}
	if len(calls) == 0 {
		return caps
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out := make([][]algorithms.Decision, len(calls))
	s.applyAll(lctx, calls, out)
	for j, ds := range out {
		if ds == nil {
			continue // keep the last capacity
		}
		sb := work[idx[j]]
		d := ds[sb.pol.tight]
		left := sb.pol.limit.Window
		if !sb.pol.sliding && d.ResetAfter > 0 && d.ResetAfter < left {
			left = d.ResetAfter
		}
		left = max(left, period)
		sb.capacity = float64(d.Remaining) / left.Seconds()
		caps[idx[j]] = sb.capacity
	}
	return caps
}

// sharesFailed is called when the Shares could not be read or written
// for a report: nothing is assigned this time. Envoy keeps the
// assignments it has until their TTL (then its
// expired_assignment_behavior applies), and new buckets stay at its
// no_assignment_behavior.
func (s *Service) sharesFailed(err error, work []*sub) {
	s.m.sharesError()
	s.logEvery(&s.sharesLog, "RLQS shares unavailable: no assignment made for this report; Envoy keeps its assignments until their TTL", "error", err.Error(), "buckets", len(work))
}

func (s *Service) logLedger(err error) {
	s.logEvery(&s.ledgerLog, "RLQS ledger: charging the counters RLS shares failed", "error", err.Error())
}

// logInterval spaces repeated log lines of one kind.
const logInterval = 10 * time.Second

// logEvery logs msg unless one of its kind was logged in the last
// logInterval.
func (s *Service) logEvery(last *atomicTime, msg string, args ...any) {
	now := s.now()
	if prev := last.Load(); !prev.IsZero() && now.Sub(prev) < logInterval {
		return
	}
	last.Store(now)
	s.log.Warn(msg, args...)
}
