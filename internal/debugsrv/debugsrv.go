// Package debugsrv is the debug listener the reference server has on :6070:
// /rlconfig (the loaded limits, as the reference prints them; Envoy
// Gateway's `egctl config ratelimit` reads it), /rlconfig?format=json, and
// Go's /debug/pprof/ profiles.
package debugsrv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// Handler serves the debug endpoints for the config that current returns
// (nil before the first config arrives).
func Handler(current func() *descriptors.Config) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, r *http.Request) {
		cfg := current()
		if r.URL.Query().Get("format") == "json" {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(JSON(cfg))
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if cfg != nil {
			_ = cfg.Dump(w)
		}
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "/rlconfig: the loaded rate limits (?format=json for JSON)\n/debug/pprof/: Go profiles\n")
	})
	return mux
}

// Descriptor is one configured descriptor in the JSON form of /rlconfig.
type Descriptor struct {
	Domain         string  `json:"domain"`
	FullKey        string  `json:"full_key"` // domain.key_value..., as in the text form
	Key            string  `json:"key"`
	Value          string  `json:"value,omitempty"`
	ShadowMode     bool    `json:"shadow_mode,omitempty"`
	QuotaMode      bool    `json:"quota_mode,omitempty"`
	DetailedMetric bool    `json:"detailed_metric,omitempty"`
	ValueToMetric  bool    `json:"value_to_metric,omitempty"`
	ShareThreshold bool    `json:"share_threshold,omitempty"`
	Limits         []Limit `json:"limits,omitempty"`
	File           string  `json:"file"`
	Line           int     `json:"line"`
}

// Limit is one limit of a Descriptor.
type Limit struct {
	Name            string   `json:"name,omitempty"`
	Unit            string   `json:"unit,omitempty"`
	Window          string   `json:"window,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	Algorithm       string   `json:"algorithm,omitempty"`
	Burst           uint64   `json:"burst,omitempty"`
	Shadow          bool     `json:"shadow_mode,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
	Consistency     string   `json:"consistency,omitempty"`
}

// JSON lists every descriptor of cfg, in the order of Config.Walk. A nil
// config gives an empty list.
func JSON(cfg *descriptors.Config) []Descriptor {
	out := []Descriptor{}
	if cfg == nil {
		return out
	}
	cfg.Walk(func(d *descriptors.Domain, n *descriptors.Node) {
		e := Descriptor{
			Domain: d.Name, FullKey: n.FullKey(), Key: n.Key, Value: n.Value,
			ShadowMode: n.ShadowMode, QuotaMode: n.QuotaMode, DetailedMetric: n.DetailedMetric,
			ValueToMetric: n.ValueToMetric, ShareThreshold: n.ShareThreshold, File: d.NodeFile(n), Line: n.Line,
		}
		for _, l := range n.Limits {
			jl := Limit{Name: l.Name, Unit: l.Unit, RequestsPerUnit: l.RequestsPerUnit, Unlimited: l.Unlimited, Shadow: l.Shadow, Replaces: l.Replaces, Consistency: l.Consistency.String()}
			if !l.Unlimited {
				jl.Window = l.Limit.Window.String()
				jl.Algorithm = l.Limit.Algorithm.String()
				jl.Burst = l.Limit.Burst
			}
			e.Limits = append(e.Limits, jl)
		}
		out = append(out, e)
	})
	return out
}
