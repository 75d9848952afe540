package main

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// newRedisStore builds the Redis store from the options.
func newRedisStore(o options, reg prometheus.Registerer, log *slog.Logger) (backend.Store, error) {
	return nil, errors.New("redis backend: not wired yet")
}
