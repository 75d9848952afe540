package rls

import (
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Observer receives the decisions of a Service, for a Go program that
// embeds it (audit logs, custom metrics, alerts). Observers run off the
// decision path: each has its own queue and goroutine, and when its queue is
// full the event is dropped and counted rather than slowing a request.
type Observer interface {
	ObserveDecision(*DecisionEvent)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(*DecisionEvent)

// ObserveDecision calls f.
func (f ObserverFunc) ObserveDecision(e *DecisionEvent) { f(e) }

// DecisionEvent describes one ShouldRateLimit call that reached a decision
// (invalid requests are not reported). Observers must not modify it: every
// observer gets the same event.
type DecisionEvent struct {
	// Time is when the call started; Duration how long it took.
	Time     time.Time
	Duration time.Duration
	// Domain is the request's domain; Known reports whether the config
	// defines it. It is the request's bytes, which need not be valid
	// UTF-8 (see internal/textsafe to show them).
	Domain string
	Known  bool
	// Code is "ok", "over_limit", "shadow_over_limit" (global shadow mode),
	// "unavailable" or "failed_open" (the backend failed; Err says why).
	Code string
	Err  error
	// Limits are the limits the request was decided against, in request
	// order.
	Limits []LimitEvent
	// Unmatched counts the request's descriptors that matched no rule.
	Unmatched int
}

// LimitEvent is one limit's part in a decision.
type LimitEvent struct {
	// Descriptor is the index of the request descriptor.
	Descriptor int
	// Rule is the limit's name, or its descriptor path (with "#i" for the
	// i-th limit of an unnamed composite).
	Rule string
	// Hits is what the request asked of the limit.
	Hits uint64
	// Allowed, Remaining and RetryAfter are the limit's decision (zero when
	// the backend failed).
	Allowed    bool
	Remaining  uint64
	RetryAfter time.Duration
	// Shadow and Quota report the limit's mode.
	Shadow bool
	Quota  bool
	// Consistency is where the store may decide the limit: strict, lease
	// or approximate (see Options.Consistency).
	Consistency backend.Consistency
}

// ObserverQueue is the default number of events queued per observer.
const ObserverQueue = 1024

// observers fans events out to each observer's queue.
type observers struct {
	subs    []*subscription
	dropped atomic.Uint64
	onDrop  func()
	wg      sync.WaitGroup
	mu      sync.RWMutex // held for reading while publishing, for writing by close
	closed  bool
}

type subscription struct {
	o  Observer
	ch chan *DecisionEvent
}

func newObservers(list []Observer, queue int, onDrop func()) *observers {
	if len(list) == 0 {
		return nil
	}
	if queue <= 0 {
		queue = ObserverQueue
	}
	obs := &observers{onDrop: onDrop}
	for _, o := range list {
		sub := &subscription{o: o, ch: make(chan *DecisionEvent, queue)}
		obs.subs = append(obs.subs, sub)
		obs.wg.Add(1)
		go func() {
			defer obs.wg.Done()
			for e := range sub.ch {
				sub.o.ObserveDecision(e)
			}
		}()
	}
	return obs
}

// publish hands e to every observer without waiting; a full queue drops it.
// After close it does nothing.
func (obs *observers) publish(e *DecisionEvent) {
	obs.mu.RLock()
	defer obs.mu.RUnlock()
	if obs.closed {
		return
	}
	for _, sub := range obs.subs {
		select {
		case sub.ch <- e:
		default:
			obs.dropped.Add(1)
			if obs.onDrop != nil {
				obs.onDrop()
			}
		}
	}
}

// close stops accepting events and waits for the observers to drain their
// queues.
func (obs *observers) close() {
	obs.mu.Lock()
	if !obs.closed {
		obs.closed = true
		for _, sub := range obs.subs {
			close(sub.ch)
		}
	}
	obs.mu.Unlock()
	obs.wg.Wait()
}

// newEvent returns the observers' event of a request with n limits whose
// Limits are to be filled (see limitEvent), nil when nothing observes.
func (s *Service) newEvent(req *rlsv3.RateLimitRequest, known bool, code string, err error, now time.Time, unmatched, n int) *DecisionEvent {
	if s.obs == nil {
		return nil
	}
	e := &DecisionEvent{Time: now, Domain: req.Domain, Known: known, Code: code, Err: err, Unmatched: unmatched}
	if n > 0 {
		e.Limits = make([]LimitEvent, n)
	}
	return e
}

// limitEvent is an event's view of item it, of rule, decided as d (nil:
// the store failed).
func limitEvent(it *backend.Item, o *owner, rule string, d *algorithms.Decision) LimitEvent {
	le := LimitEvent{Descriptor: o.desc, Rule: rule, Hits: it.Hits, Shadow: it.Mode == backend.Shadow, Quota: it.Mode == backend.Quota, Consistency: it.Consistency}
	if d != nil {
		le.Allowed, le.Remaining, le.RetryAfter = d.Allowed, d.Remaining, d.RetryAfter
	}
	return le
}
