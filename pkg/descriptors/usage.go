package descriptors

import "fmt"

// UsageAccounting says which hits charged to a descriptor are usage
// accounting: hits that already happened, counted even when they do not fit
// (past the limit, or as a bucket's debt), instead of hits of an admission
// that a denial refuses (and then charges nothing).
//
// Envoy cannot say which a charge is: its rate limit filter sends a
// descriptor's hits_addend whenever the rate limit action has one, on the
// request path and when the stream is done (apply_on_stream_done) alike,
// and the two calls look the same on the wire. What it does say is whether
// the hits were given on the descriptor at all: Envoy sets a descriptor's
// hits_addend only from the action's own hits_addend (a number, or a format
// such as the token count in dynamic metadata), which is how Envoy
// Gateway renders cost.request and cost.response, and Envoy AI Gateway its
// token costs. A request without it is an ordinary admission of one hit
// (or of the request's hits_addend, which Envoy takes from filter state for
// both calls). Hence Auto.
type UsageAccounting uint8

const (
	// UsageUnset is the zero value: not set here, so the enclosing
	// descriptor, the file's default_usage_accounting or the service's
	// default decides. Where nothing sets it, it means UsageAuto.
	UsageUnset UsageAccounting = iota
	// UsageAuto accounts the hits given explicitly on the descriptor (its
	// own hits_addend, above 0) whether or not they fit, as the reference
	// server counts every charge; ordinary admission (no descriptor
	// hits_addend) charges nothing when denied.
	UsageAuto
	// UsageAlways accounts every charge (hits above 0) to the descriptor,
	// whatever the verdict: the reference server's counting, where a
	// denied request is charged too.
	UsageAlways
	// UsageNever accounts nothing: a denied request charges nothing, even
	// with hits given on the descriptor.
	UsageNever
)

var usageNames = [...]string{UsageUnset: "", UsageAuto: "auto", UsageAlways: "always", UsageNever: "never"}

// String returns the configuration name ("auto", "always", "never"), or ""
// for UsageUnset.
func (u UsageAccounting) String() string {
	if int(u) < len(usageNames) {
		return usageNames[u]
	}
	return fmt.Sprintf("UsageAccounting(%d)", uint8(u))
}

// ParseUsageAccounting returns the value of a configuration name: auto,
// always or never.
func ParseUsageAccounting(s string) (UsageAccounting, bool) {
	for i, n := range usageNames {
		if n != "" && n == s {
			return UsageAccounting(i), true
		}
	}
	return UsageUnset, false
}

// MarshalText implements encoding.TextMarshaler.
func (u UsageAccounting) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: auto, always or never.
func (u *UsageAccounting) UnmarshalText(b []byte) error {
	v, ok := ParseUsageAccounting(string(b))
	if !ok {
		return fmt.Errorf("want auto, always or never")
	}
	*u = v
	return nil
}

// Or returns u, or def when u is UsageUnset.
func (u UsageAccounting) Or(def UsageAccounting) UsageAccounting {
	if u == UsageUnset {
		return def
	}
	return u
}

// Accounts reports whether a charge of hits to a descriptor is usage
// accounting under u; explicit says the hits were the descriptor's own
// hits_addend. A check (0 hits) never is: there is nothing to account.
// UsageUnset counts as UsageAuto.
func (u UsageAccounting) Accounts(hits uint64, explicit bool) bool {
	switch {
	case hits == 0 || u == UsageNever:
		return false
	case u == UsageAlways:
		return true
	}
	return explicit
}

// usageAccounting reads a usage_accounting or default_usage_accounting
// field; unset is UsageUnset.
func (p *parser) usageAccounting(f field, name string) UsageAccounting {
	s, ok := p.str(f, name)
	if !ok {
		return UsageUnset
	}
	u, ok := ParseUsageAccounting(s)
	if !ok {
		p.errorf(f.key.Line, "unknown %s %q (want auto, always or never)", name, s)
	}
	return u
}
