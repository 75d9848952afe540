package backend

import (
	"fmt"
	"strconv"
)

// Consistency says where an item's decision may be made when several
// instances share one store (see pkg/backend/consistency, which wraps the
// Redis store). Stores that keep their state in this process alone (the
// memory store) decide every item in their state whatever it says: there is
// nothing to share, so every mode is Strict there.
type Consistency uint8

const (
	// Strict decides every charge in the shared store: the default, and
	// exact across any number of instances.
	Strict Consistency = iota
	// Lease decides charges from a chunk of the limit that the instance
	// reserved in the shared store beforehand. Admission never exceeds the
	// limit across instances; what a chunk holds unused is stranded until
	// it is returned (see pkg/backend/consistency for the bound).
	Lease
	// Approximate decides charges on the instance's own counters and
	// sends their deltas to the shared store in the background, within a
	// stated bound of over-admission (see pkg/backend/consistency).
	Approximate
)

var consistencyNames = [...]string{Strict: "strict", Lease: "lease", Approximate: "approximate"}

// String returns the configuration name: "strict", "lease" or
// "approximate".
func (c Consistency) String() string {
	if int(c) < len(consistencyNames) {
		return consistencyNames[c]
	}
	return "Consistency(" + strconv.Itoa(int(c)) + ")"
}

// ParseConsistency returns the consistency of a configuration name: strict,
// lease or approximate.
func ParseConsistency(s string) (Consistency, bool) {
	for i, n := range consistencyNames {
		if n == s {
			return Consistency(i), true
		}
	}
	return Strict, false
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
