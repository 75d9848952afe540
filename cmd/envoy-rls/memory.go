package main

// The embedded store: the memory backend, and the fallback store of
// --failure-mode local.

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// memoryOptions bound an embedded store.
type memoryOptions struct {
	MaxKeys        int
	MaxMemory      byteSize
	PenaltyKeys    int
	RememberedKeys int
}

// minMaxMemory is the least --max-memory.
const minMaxMemory = 1 << 20

func (o *memoryOptions) addFlags(fs *flagSet) {
	fs.IntVar(&o.MaxKeys, "max-keys", memory.DefaultMaxKeys, "embedded store (memory backend, or redis's --failure-mode local fallback): most counter keys held; beyond it, the keys least likely to be used again are evicted")
	o.MaxMemory = memory.DefaultMaxMemory
	fs.TextVar(&o.MaxMemory, "max-memory", &o.MaxMemory, "embedded store: most estimated bytes of counter keys held (key bytes + about 240 per key), e.g. 256MiB or 1GB; with --max-keys, whichever binds first")
	fs.IntVar(&o.RememberedKeys, "remembered-keys", memory.DefaultRememberedKeys, "embedded store: most evicted keys whose state (part used or exhausted) is kept until it is fresh, so a flood of new keys gives no key its quota back (32 bytes each, taken as evictions fill the table; 0 disables)")
	fs.IntVar(&o.PenaltyKeys, "penalty-keys", memory.DefaultPenaltyKeys, "embedded store: most exhausted keys kept denied after eviction until their state is fresh (about 130 bytes each; 0 disables)")
}

// memoryFlags are the flags of memoryOptions: the memory backend's, and
// the redis backend's under --failure-mode local only.
var memoryFlags = []string{"max-keys", "max-memory", "remembered-keys", "penalty-keys"}

// validate checks the bounds; c names where a value came from.
func (o memoryOptions) validate(c *command) []error {
	var errs []error
	if o.MaxKeys < 1 {
		errs = append(errs, errors.New("--max-keys must be at least 1"))
	}
	if o.MaxMemory < minMaxMemory {
		errs = append(errs, fmt.Errorf("%s: want at least %s", c.value("max-memory", formatSize(uint64(o.MaxMemory))), formatSize(minMaxMemory)))
	}
	if o.RememberedKeys < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative (0 disables the remembered table)", c.value("remembered-keys", fmt.Sprint(o.RememberedKeys))))
	}
	if o.PenaltyKeys < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative (0 disables the penalty set)", c.value("penalty-keys", fmt.Sprint(o.PenaltyKeys))))
	}
	return errs
}

// newStore returns an embedded store with these bounds, its metrics
// registered on reg.
func (o memoryOptions) newStore(reg prometheus.Registerer) *memory.Store {
	m := memory.New(
		memory.WithMaxKeys(o.MaxKeys),
		memory.WithMaxMemory(uint64(o.MaxMemory)),
		memory.WithRememberedKeys(o.RememberedKeys),
		memory.WithPenaltyKeys(o.PenaltyKeys),
	)
	registerMemoryMetrics(reg, m)
	return m
}
