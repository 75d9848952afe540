package rls

import (
	"errors"
	"fmt"
	"math"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Request size limits. A request beyond them is InvalidArgument: Envoy never
// sends anything close, and a bound keeps one request from holding the
// store's locks for long.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxFieldBytes  = 4096
)

// validate checks what the proto cannot: the request must name a domain and
// carry at least one descriptor, within the size limits. A descriptor
// without entries, or with an entry whose key is empty, is not an error:
// like the reference, it matches no limit (see empty).
func validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.GetDomain() == "":
		return errors.New("domain must not be empty")
	case len(req.Domain) > MaxFieldBytes:
		return fmt.Errorf("domain is longer than %d bytes", MaxFieldBytes)
	case len(req.Descriptors) == 0:
		return errors.New("request has no descriptors")
	case len(req.Descriptors) > MaxDescriptors:
		return fmt.Errorf("request has %d descriptors, more than %d", len(req.Descriptors), MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if len(d.GetEntries()) > MaxEntries {
			return fmt.Errorf("descriptor %d has %d entries, more than %d", i, len(d.Entries), MaxEntries)
		}
		for j, e := range d.GetEntries() {
			if len(e.GetKey()) > MaxFieldBytes || len(e.GetValue()) > MaxFieldBytes {
				return fmt.Errorf("descriptor %d entry %d is longer than %d bytes", i, j, MaxFieldBytes)
			}
		}
		if d == nil {
			continue
		}
		if o := d.Limit; o != nil {
			if _, err := overrideWindow(o); err != nil {
				return fmt.Errorf("descriptor %d limit override: %v", i, err)
			}
		}
	}
	return nil
}

var unitWindows = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// overrideWindow returns the window of a request-supplied limit override:
// its unit times its unit_multiplier (default 1). A window longer than a
// time.Duration holds (about 292 years) is an error rather than a
// wrapped-around product.
func overrideWindow(o *commonv3.RateLimitDescriptor_RateLimitOverride) (time.Duration, error) {
	w, ok := unitWindows[o.Unit]
	if !ok {
		return 0, fmt.Errorf("unit %v is not a known unit", o.Unit)
	}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.Value == 0 {
			return 0, errors.New("unit_multiplier must be at least 1")
		}
		if time.Duration(m.Value) > math.MaxInt64/w {
			return 0, fmt.Errorf("window of %d x %v is too long", m.Value, o.Unit)
		}
		w *= time.Duration(m.Value)
	}
	return w, nil
}
