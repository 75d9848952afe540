package descriptors

import (
	"fmt"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// Consistency says where the decisions of a limit are made when several
// instances share one Redis: strict (every decision in Redis, the default),
// lease (from chunks of the limit an instance reserved in Redis; never more
// than the limit) or approximate (on the instance's own counters, synced in
// the background, within a stated bound). On the embedded store every
// limit is strict. See docs/consistency.md.
type Consistency uint8

const (
	// ConsistencyUnset is the zero value: not set on the limit nor in its
	// file, so the service's default (--consistency) decides.
	ConsistencyUnset Consistency = iota
	// ConsistencyStrict decides every charge in the shared store.
	ConsistencyStrict
	// ConsistencyLease decides charges from chunks reserved beforehand.
	ConsistencyLease
	// ConsistencyApproximate decides charges on local counters synced in
	// the background.
	ConsistencyApproximate
)

var consistencyNames = [...]string{ConsistencyUnset: "", ConsistencyStrict: "strict", ConsistencyLease: "lease", ConsistencyApproximate: "approximate"}

// String returns the configuration name ("strict", "lease",
// "approximate"), or "" for ConsistencyUnset.
func (c Consistency) String() string {
	if int(c) < len(consistencyNames) {
		return consistencyNames[c]
	}
	return fmt.Sprintf("Consistency(%d)", uint8(c))
}

// ParseConsistency returns the consistency of a configuration name: strict,
// lease or approximate.
func ParseConsistency(s string) (Consistency, bool) {
	for i, n := range consistencyNames {
		if n != "" && n == s {
			return Consistency(i), true
		}
	}
	return ConsistencyUnset, false
}

// MarshalText implements encoding.TextMarshaler.
func (c Consistency) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: strict, lease or
// approximate.
func (c *Consistency) UnmarshalText(b []byte) error {
	v, ok := ParseConsistency(string(b))
	if !ok {
		return fmt.Errorf("want strict, lease or approximate")
	}
	*c = v
	return nil
}

// Or returns c, or def when c is ConsistencyUnset.
func (c Consistency) Or(def Consistency) Consistency {
	if c == ConsistencyUnset {
		return def
	}
	return c
}

// Relaxed reports whether c is lease or approximate.
func (c Consistency) Relaxed() bool { return c == ConsistencyLease || c == ConsistencyApproximate }

// SupportsConsistency reports whether an algorithm can be decided with
// lease or approximate consistency: every one but sliding_window_log,
// whose state is the time of each hit, which no chunk or delta can carry.
// A sliding_window_log limit is decided strict whatever its file's default
// or the service's says (a limit of its own that asks for lease or
// approximate does not load).
func SupportsConsistency(k algorithms.Kind) bool { return k != algorithms.SlidingWindowLog }

// consistency reads a consistency or default_consistency field; unset is
// ConsistencyUnset.
func (p *parser) consistency(f field, name string) Consistency {
	s, ok := p.str(f, name)
	if !ok {
		return ConsistencyUnset
	}
	c, ok := ParseConsistency(s)
	if !ok {
		p.errorf(f.key.Line, "unknown %s %q (want strict, lease or approximate)", name, s)
	}
	return c
}
