package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// registerMemoryMetrics exports the memory store's counters (the metrics
// are defined in pkg/rls/metrics.go).
func registerMemoryMetrics(reg prometheus.Registerer, m *memory.Store) {
	reg.MustRegister(
		rls.MemoryKeys.Collector(func() float64 { return float64(m.Stats().Keys) }),
		rls.MemoryBytes.Collector(func() float64 { return float64(m.Stats().Bytes) }),
		rls.MemoryPenaltyKeys.Collector(func() float64 { return float64(m.Stats().PenaltyKeys) }),
		rls.MemoryPenaltyRestored.Collector(func() float64 { return float64(m.Stats().PenaltyRestored) }),
		rls.MemoryPenaltyDropped.Collector(func() float64 { return float64(m.Stats().PenaltyDropped) }),
		rls.MemoryEvictions.With("kind", "fresh").Collector(func() float64 { st := m.Stats(); return float64(st.Evicted - st.EvictedLive) }),
		rls.MemoryEvictions.With("kind", "remembered").Collector(func() float64 { return float64(m.Stats().EvictedRemembered) }),
		rls.MemoryEvictions.With("kind", "penalty").Collector(func() float64 { return float64(m.Stats().EvictedPenalty) }),
		rls.MemoryEvictions.With("kind", "lost").Collector(func() float64 { return float64(m.Stats().EvictedLost) }),
		rls.MemoryRememberedKeys.Collector(func() float64 { return float64(m.Stats().RememberedKeys) }),
		rls.MemoryRememberedRestored.Collector(func() float64 { return float64(m.Stats().RememberedRestored) }),
		rls.MemoryRememberedDropped.With("kind", "part_used").Collector(func() float64 { return float64(m.Stats().RememberedDroppedPart) }),
		rls.MemoryRememberedDropped.With("kind", "exhausted").Collector(func() float64 { return float64(m.Stats().RememberedDroppedExhausted) }),
		rls.MemoryEvictedLive.Collector(func() float64 { return float64(m.Stats().EvictedLive) }),
		rls.MemorySwept.Collector(func() float64 { return float64(m.Stats().Swept) }),
	)
}

// registerRedisMetrics exports the Redis store's counters (the metrics are
// defined in pkg/rls/metrics.go).
func registerRedisMetrics(reg prometheus.Registerer, r *redis.Store) {
	stat := func(m rls.StoreMetric, f func(redis.Stats) uint64) prometheus.Collector {
		return m.Collector(func() float64 { return float64(f(r.Stats())) })
	}
	reg.MustRegister(
		stat(rls.RedisRequests, func(s redis.Stats) uint64 { return s.Requests }),
		stat(rls.RedisRoundTrips, func(s redis.Stats) uint64 { return s.RoundTrips }),
		stat(rls.RedisScriptCalls, func(s redis.Stats) uint64 { return s.ScriptCalls }),
		stat(rls.RedisLocalDenials, func(s redis.Stats) uint64 { return s.LocalDenials }),
		// Deprecated for envoy_rls_backend_errors_total, and kept meaning
		// every call Redis failed: those the failure mode answered and
		// those the local fallback decided.
		stat(rls.RedisErrors, func(s redis.Stats) uint64 { return s.Errors + s.LocalFallbacks }),
		stat(rls.RedisScriptReloads, func(s redis.Stats) uint64 { return s.ScriptReloads }),
		stat(rls.RedisNotSent, func(s redis.Stats) uint64 { return s.NotSent }),
		stat(rls.RedisOOMErrors, func(s redis.Stats) uint64 { return s.OOM }),
		stat(rls.RedisClusterRefunds.With("result", "done"), func(s redis.Stats) uint64 { return s.Refunds }),
		stat(rls.RedisClusterRefunds.With("result", "failed"), func(s redis.Stats) uint64 { return s.RefundsFailed }),
		stat(rls.RedisLateCharged, func(s redis.Stats) uint64 { return s.LateCharged }),
		stat(rls.RedisLateUnsure, func(s redis.Stats) uint64 { return s.LateUnsure }),
		stat(rls.RedisWriteBackHits, func(s redis.Stats) uint64 { return s.WriteBackHits }),
		stat(rls.RedisWriteBackOverLimit, func(s redis.Stats) uint64 { return s.WriteBackOverLimit }),
		stat(rls.RedisWriteBackRetried, func(s redis.Stats) uint64 { return s.WriteBackRetried }),
		stat(rls.RedisWriteBackUnsure, func(s redis.Stats) uint64 { return s.WriteBackUnsure }),
		stat(rls.RedisWriteBackDropped.With("reason", "buffer_full"), func(s redis.Stats) uint64 { return s.WriteBackDropped }),
		stat(rls.RedisWriteBackDropped.With("reason", "shutdown"), func(s redis.Stats) uint64 { return s.WriteBackDroppedAtClose }),
		rls.RedisWriteBackPending.Collector(func() float64 { return float64(r.Stats().WriteBackPending) }),
		rls.RedisEvictingServers.Collector(func() float64 {
			n := 0
			for _, l := range r.ServerLimits() {
				if l.EvictsCounters() {
					n++
				}
			}
			return float64(n)
		}),
		stat(rls.RedisDecisions.With("path", "redis"), func(s redis.Stats) uint64 { return s.Decided }),
		stat(rls.RedisDecisions.With("path", "chunk"), func(s redis.Stats) uint64 { return s.ChunkDecided }),
		stat(rls.RedisDecisions.With("path", "approximate"), func(s redis.Stats) uint64 { return s.ApproximateDecided }),
		stat(rls.RedisDecisions.With("path", "deny_cache"), func(s redis.Stats) uint64 { return s.LocalDenials }),
		stat(rls.RedisLeaseChunks, func(s redis.Stats) uint64 { return s.Lease.Chunks }),
		stat(rls.RedisLeaseGranted, func(s redis.Stats) uint64 { return s.Lease.Granted }),
		stat(rls.RedisLeaseReturned, func(s redis.Stats) uint64 { return s.Lease.Returned }),
		stat(rls.RedisLeaseStranded, func(s redis.Stats) uint64 { return s.Lease.Stranded }),
		stat(rls.RedisLeaseErrors.With("op", "reserve"), func(s redis.Stats) uint64 { return s.Lease.RefillErrors }),
		stat(rls.RedisLeaseErrors.With("op", "return"), func(s redis.Stats) uint64 { return s.Lease.ReturnErrors }),
		stat(rls.RedisApproximateSyncs, func(s redis.Stats) uint64 { return s.Approximate.Syncs }),
		stat(rls.RedisApproximateSyncErrors, func(s redis.Stats) uint64 { return s.Approximate.SyncErrors }),
		stat(rls.RedisApproximateSyncedHits, func(s redis.Stats) uint64 { return s.Approximate.SyncedHits }),
		stat(rls.RedisApproximateLostHits, func(s redis.Stats) uint64 { return s.Approximate.LostHits }),
		stat(rls.RedisApproximateOverAdmitted, func(s redis.Stats) uint64 { return s.Approximate.OverAdmitted }),
		stat(rls.RedisApproximateStrict, func(s redis.Stats) uint64 { return s.Approximate.Strict }),
		stat(rls.RedisApproximateChunked, func(s redis.Stats) uint64 { return s.Approximate.Chunked }),
		stat(rls.RedisDecisions.With("path", "local_fallback"), func(s redis.Stats) uint64 { return s.LocalFallbacks }),
		stat(rls.RedisDecisions.With("path", "failed"), func(s redis.Stats) uint64 { return s.Errors }),
		stat(rls.RedisNodeTrips, func(s redis.Stats) uint64 { return s.NodeTrips }),
		stat(rls.RedisNodeReturns, func(s redis.Stats) uint64 { return s.NodeReturns }),
		stat(rls.RedisStallProbes, func(s redis.Stats) uint64 { return s.StallProbes }),
		stat(rls.RedisNodeDownCalls, func(s redis.Stats) uint64 { return s.NodeDownCalls }),
		rls.RedisNodesDown.Collector(func() float64 { return float64(r.Stats().NodesDown) }),
	)
}

// registerSplitMetrics exports the split store's counters (the metrics are
// defined in pkg/rls/metrics.go).
func registerSplitMetrics(reg prometheus.Registerer, s *split.Store) {
	reg.MustRegister(
		rls.PerSecondMixed.Collector(func() float64 { return float64(s.Stats().Mixed) }),
		rls.PerSecondOverCharged.Collector(func() float64 { return float64(s.Stats().OverCharged) }),
	)
}
