// Package refenv reads the environment of the reference rate limit server
// (envoyproxy/ratelimit, src/settings/settings.go) and turns it into
// envoy-rls flag settings, so that envoy-rls runs unchanged where the
// reference runs: Envoy Gateway's Deployment (no arguments, environment
// only) and Istio's sample.
//
// Every variable of the reference is known here (vars.go). Translate maps
// each one that is set to native flags; a variable whose value cannot be
// honoured (BACKEND_TYPE=memcache, USE_STATSD=true, ...) is an error that
// names it; one that has no meaning for envoy-rls is reported in Ignored.
// Variables the reference does not know are not looked at.
package refenv

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Setting is one flag value taken from the reference's environment (or its
// defaults).
type Setting struct {
	Flag  string // the flag name without dashes, e.g. "grpc-addr"
	Value string
	From  string // the variables it comes from, or "reference default"
	// Vars are the variables that set it, whether or not they are set
	// (to name what to change).
	Vars []string
}

// Ignored is a variable that was set but has no meaning for envoy-rls.
type Ignored struct {
	Var    string
	Reason string
}

// Result is what Translate found.
type Result struct {
	// Settings are flag values in a stable order. A flag appears at most
	// once.
	Settings []Setting
	// Ignored lists the set variables with no meaning here, by name.
	Ignored []Ignored
}

// Lookup reads one environment variable, like os.LookupEnv.
type Lookup func(string) (string, bool)

// FromMap is a Lookup over a map (for tests).
func FromMap(m map[string]string) Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Lookup returns the value of flag in r and whether it is set.
func (r *Result) Lookup(flag string) (Setting, bool) {
	for _, s := range r.Settings {
		if s.Flag == flag {
			return s, true
		}
	}
	return Setting{}, false
}

// translator accumulates the result and every error.
type translator struct {
	env  Lookup
	res  Result
	errs []error
}

func (t *translator) get(name string) (string, bool) {
	v, ok := t.env(name)
	return v, ok
}

// str returns the variable's value, or def when unset.
func (t *translator) str(name, def string) string {
	if v, ok := t.get(name); ok {
		return v
	}
	return def
}

func (t *translator) boolean(name string, def bool) bool {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want true or false", name, v))
		return def
	}
	return b
}

func (t *translator) integer(name string, def int) int {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want an integer", name, v))
		return def
	}
	return n
}

func (t *translator) float(name string, def float64) float64 {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want a number", name, v))
		return def
	}
	return f
}

func (t *translator) duration(name string, def time.Duration) (time.Duration, bool) {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want a duration like 10s", name, v))
		return def, false
	}
	return d, true
}

// set records a flag value; from names the variables, which count as
// "reference default" when none of them is set.
func (t *translator) set(flag, value string, from ...string) {
	src := "reference default"
	var named []string
	for _, f := range from {
		if _, ok := t.get(f); ok {
			named = append(named, f)
		}
	}
	if len(named) > 0 {
		src = strings.Join(named, ", ")
	}
	for i := range t.res.Settings {
		if t.res.Settings[i].Flag == flag {
			t.res.Settings[i] = Setting{Flag: flag, Value: value, From: src, Vars: from}
			return
		}
	}
	t.res.Settings = append(t.res.Settings, Setting{Flag: flag, Value: value, From: src, Vars: from})
}

// isSet reports a variable that is set (even to "").
func (t *translator) isSet(name string) bool {
	_, ok := t.get(name)
	return ok
}

func (t *translator) unsupported(name, value, why string) {
	t.errs = append(t.errs, fmt.Errorf("%s=%s is not supported by envoy-rls: %s", name, value, why))
}

func (t *translator) ignore(name, reason string) {
	if t.isSet(name) {
		t.res.Ignored = append(t.res.Ignored, Ignored{Var: name, Reason: reason})
	}
}

// Translate reads the reference's variables through env.
func Translate(env Lookup) (*Result, error) {
	t := &translator{env: env}
	t.listeners()
	t.grpcTLS()
	t.logging()
	t.configSource()
	t.stats()
	t.backend()
	t.modes()
	t.ignored()
	sort.Slice(t.res.Ignored, func(i, j int) bool { return t.res.Ignored[i].Var < t.res.Ignored[j].Var })
	return &t.res, errors.Join(t.errs...)
}
