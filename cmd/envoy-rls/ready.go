package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/health"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// readiness is what /healthz, /healthcheck and gRPC health report. The
// service is ready once its backend has answered once (the memory store at
// once, Redis at its first PING), and stops being ready when shutdown
// begins. A Redis outage after that does not make it unready: the failure
// mode decides the answers then, and taking every instance out of its load
// balancer at once would not help (see README, Health). Under
// --health-requires-config it is also not ready while no config with a
// domain is loaded, as the reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
// makes its /healthcheck and gRPC health say.
type readiness struct {
	health    *health.Server
	hasConfig func() bool // nil when no config is required

	mu       sync.Mutex
	ready    bool
	stopping bool
	why      string // while not ready: the last reason
}

// pinger is a store that can check its backend (the Redis store).
type pinger interface {
	Ping(ctx context.Context) error
}

// newReadiness returns the readiness of a service on store; when the store
// can be pinged, it is not ready (and gRPC health says NOT_SERVING) until
// the first successful ping, which run retries in the background. When
// hasConfig is not nil, it is not ready either while hasConfig says no
// (call configChanged when the config changes).
func newReadiness(store backend.Store, hs *health.Server, hasConfig func() bool) *readiness {
	r := &readiness{health: hs, ready: true, hasConfig: hasConfig}
	if _, ok := store.(pinger); ok {
		r.ready, r.why = false, "redis not reachable yet: not checked yet"
	}
	r.apply()
	return r
}

// apply makes gRPC health say what status says (r.mu held, or r not
// shared yet).
func (r *readiness) apply() {
	if ok, _ := r.statusLocked(); ok {
		r.health.Resume()
	} else {
		r.health.Shutdown() // every service NOT_SERVING until Resume
	}
}

// configChanged updates gRPC health after the config changed.
func (r *readiness) configChanged() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apply()
}

// status returns whether the service is ready and, when not, why.
func (r *readiness) status() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.statusLocked()
}

func (r *readiness) statusLocked() (bool, string) {
	switch {
	case r.stopping:
		return false, "shutting down"
	case !r.ready:
		return false, r.why
	case r.hasConfig != nil && !r.hasConfig():
		return false, "no config with a domain loaded yet (--health-requires-config)"
	}
	return true, ""
}

// stop marks the service unready for good: shutdown began.
func (r *readiness) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = true
	r.health.Shutdown()
}

// watch pings the store until it answers or ctx ends, logging why it is
// not reachable (at once, then every logEvery) and when it is.
func (r *readiness) watch(ctx context.Context, store backend.Store, log *slog.Logger, timeout, logEvery time.Duration) {
	p, ok := store.(pinger)
	if !ok {
		return
	}
	start := time.Now()
	wait := 100 * time.Millisecond
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := p.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			r.mu.Lock()
			r.ready, r.why = true, ""
			if !r.stopping {
				r.apply()
			}
			r.mu.Unlock()
			log.Info("redis reachable", "after", time.Since(start).Round(time.Millisecond).String(), "attempts", attempt)
			return
		}
		r.mu.Lock()
		r.why = "redis not reachable yet: " + err.Error()
		r.mu.Unlock()
		if lastLog.IsZero() || time.Since(lastLog) >= logEvery {
			lastLog = time.Now()
			log.Warn("redis not reachable yet; /healthz and gRPC health answer not serving until it is",
				"error", err.Error(), "attempts", attempt, "waiting_for", time.Since(start).Round(time.Millisecond).String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}
