package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// registerMemoryMetrics exports the memory store's counters.
func registerMemoryMetrics(reg prometheus.Registerer, m *memory.Store) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "envoy_rls_memory_keys",
			Help: "Counter keys held by the memory store.",
		}, func() float64 { return float64(m.Stats().Keys) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_memory_evictions_total",
			Help: "Keys evicted because the memory store was full (--max-keys).",
		}, func() float64 { return float64(m.Stats().Evicted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_memory_evictions_live_total",
			Help: "Evicted keys whose state was not yet fresh: they lost their count. Raise --max-keys if this grows.",
		}, func() float64 { return float64(m.Stats().EvictedLive) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_memory_swept_total",
			Help: "Keys dropped because their state was back to fresh (costs nothing).",
		}, func() float64 { return float64(m.Stats().Swept) }),
	)
}
