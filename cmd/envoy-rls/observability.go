package main

// Observability: logs, metrics, health and tracing.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/envoyrls/envoy-rls/internal/tracing"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// observabilityOptions say what the service tells about itself: its logs,
// its metrics, what its health requires, and its traces.
type observabilityOptions struct {
	LogLevel             logLevel
	LogFormat            logFormat
	ReferenceMetrics     bool
	NearLimitRatio       float64
	HealthRequiresConfig bool
	// Tracing is read from the environment (OTEL_EXPORTER_OTLP_*,
	// TRACING_*) with the flags; it has no flag of its own.
	Tracing tracing.Config
}

func (o *observabilityOptions) addFlags(fs *flagSet) {
	fs.TextVar(&o.LogLevel, "log-level", logLevel(slog.LevelInfo), "debug, info, warn or error")
	fs.TextVar(&o.LogFormat, "log-format", logFormat("text"), "text or json")
	fs.BoolVar(&o.ReferenceMetrics, "reference-metrics", false, "also export the reference server's series (ratelimit_service_*) that Envoy Gateway's dashboards read")
	fs.Float64Var(&o.NearLimitRatio, "near-limit-ratio", rls.DefaultNearLimitRatio, "share of a limit's capacity past which allowed hits also count in envoy_rls_rule_near_limit_total (0 < ratio <= 1)")
	fs.BoolVar(&o.HealthRequiresConfig, "health-requires-config", false, "report unhealthy until a config with at least one domain is loaded")
}

// readTracing reads the tracing settings through lookup.
func (o *observabilityOptions) readTracing(lookup func(string) (string, bool)) error {
	var err error
	o.Tracing, err = tracing.FromEnv(func(k string) string { v, _ := lookup(k); return v })
	if err != nil {
		return fmt.Errorf("tracing: %v", err)
	}
	return nil
}

func (o observabilityOptions) validate() []error {
	if !(o.NearLimitRatio > 0 && o.NearLimitRatio <= 1) {
		return []error{fmt.Errorf("--near-limit-ratio %v: want a number above 0 and at most 1", o.NearLimitRatio)}
	}
	return nil
}

// newLogger returns the logger writing to out.
func (o observabilityOptions) newLogger(out io.Writer) *slog.Logger {
	hopts := &slog.HandlerOptions{Level: slog.Level(o.LogLevel)}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, hopts))
	}
	return slog.New(slog.NewTextHandler(out, hopts))
}

// registerMetrics registers the service's metrics, build info and the Go
// runtime and process collectors (the store registers its own), and the
// reference's series with --reference-metrics.
func (o observabilityOptions) registerMetrics(reg prometheus.Registerer) *rls.Metrics {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rls.RegisterBuildInfo(reg, version)
	m := rls.NewMetrics(reg)
	if o.ReferenceMetrics {
		m.EnableReference(reg, o.NearLimitRatio)
	}
	return m
}

// logLevel is --log-level: debug, info, warn or error (as slog.Level reads
// them), shown in lower case.
type logLevel slog.Level

func (l logLevel) MarshalText() ([]byte, error) {
	return []byte(strings.ToLower(slog.Level(l).String())), nil
}

func (l *logLevel) UnmarshalText(b []byte) error {
	switch string(b) {
	case "debug", "info", "warn", "error", "DEBUG", "INFO", "WARN", "ERROR":
		return (*slog.Level)(l).UnmarshalText(b)
	}
	return errors.New("want debug, info, warn or error")
}

// logFormat is --log-format: text or json.
type logFormat string

func (f logFormat) MarshalText() ([]byte, error) { return []byte(f), nil }

func (f *logFormat) UnmarshalText(b []byte) error {
	switch v := logFormat(b); v {
	case "text", "json":
		*f = v
		return nil
	}
	return fmt.Errorf("want text or json")
}
