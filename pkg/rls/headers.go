package rls

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// HeaderMode selects the quota fields added to responses through
// response_headers_to_add. Retry-After is added to every OVER_LIMIT answer
// whatever the mode.
type HeaderMode uint8

const (
	// HeadersOff adds no quota fields.
	HeadersOff HeaderMode = 0
	// HeadersLegacy adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset for the binding limit (the reference server's
	// LIMIT_RESPONSE_HEADERS_ENABLED).
	HeadersLegacy HeaderMode = 1 << iota
	// HeadersIETF adds the IETF httpapi RateLimit-Policy (every limit that
	// applied) and RateLimit (the binding one) fields.
	HeadersIETF
	// HeadersDraft03 adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset as Envoy's DRAFT_VERSION_03 builds them.
	HeadersDraft03
	// HeadersAll adds all three sets.
	HeadersAll = HeadersLegacy | HeadersIETF | HeadersDraft03
)

// ParseHeaderMode parses off, ietf, draft03, legacy or all; true and false
// (the flag's former boolean values) mean legacy and off.
func ParseHeaderMode(s string) (HeaderMode, error) {
	switch strings.ToLower(s) {
	case "off", "false", "":
		return HeadersOff, nil
	case "legacy", "true":
		return HeadersLegacy, nil
	case "ietf":
		return HeadersIETF, nil
	case "draft03":
		return HeadersDraft03, nil
	case "all":
		return HeadersAll, nil
	}
	return 0, fmt.Errorf("response headers %q: want off, ietf, draft03, legacy or all", s)
}

// MarshalText implements encoding.TextMarshaler (for flags).
func (m HeaderMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseHeaderMode.
func (m *HeaderMode) UnmarshalText(b []byte) error {
	v, err := ParseHeaderMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

func (m HeaderMode) String() string {
	switch m {
	case HeadersOff:
		return "off"
	case HeadersLegacy:
		return "legacy"
	case HeadersIETF:
		return "ietf"
	case HeadersDraft03:
		return "draft03"
	case HeadersAll:
		return "all"
	}
	return "HeaderMode(" + strconv.Itoa(int(m)) + ")"
}

// legacyFields adds RateLimit-Limit, -Remaining and -Reset (named as the
// options say) for st, the binding status: its requests per unit, what
// remains of it, and the seconds until it resets, rounded up.
func (s *Service) legacyFields(a *response, sc *scratch, st *rlsv3.RateLimitResponse_DescriptorStatus) {
	a.header(sc, s.legacyNames.Limit, strconv.AppendUint(sc.hdr, uint64(st.CurrentLimit.RequestsPerUnit), 10))
	a.header(sc, s.legacyNames.Remaining, strconv.AppendUint(sc.hdr, uint64(st.LimitRemaining), 10))
	a.header(sc, s.legacyNames.Reset, strconv.AppendInt(sc.hdr, rlheaders.Seconds(st.DurationUntilReset.AsDuration()), 10))
}

// quotaFields adds the IETF and draft 03 fields the options ask for, of
// sc.policies, of which sc.policies[binding] binds.
func (s *Service) quotaFields(a *response, sc *scratch, binding int) {
	ps := sc.policies
	if s.opts.ResponseHeaders&HeadersIETF != 0 {
		a.header(sc, rlheaders.RateLimitPolicy, rlheaders.AppendPolicy(sc.hdr, ps))
		a.header(sc, rlheaders.RateLimit, rlheaders.AppendRateLimit(sc.hdr, &ps[binding]))
	}
	if s.opts.ResponseHeaders&HeadersDraft03 != 0 {
		a.header(sc, rlheaders.XRateLimitLimit, rlheaders.AppendDraft03Limit(sc.hdr, ps, binding))
		a.header(sc, rlheaders.XRateLimitRemain, strconv.AppendUint(sc.hdr, ps[binding].Remaining, 10))
		a.header(sc, rlheaders.XRateLimitReset, strconv.AppendInt(sc.hdr, rlheaders.Seconds(ps[binding].Reset), 10))
	}
}

// partitionKey returns the pk of a policy when its counter is one of many
// (some level of the descriptor takes each request value apart): the
// descriptor's 8-byte partition hash, so that a client can tell partitions
// apart without the service echoing request values. Shared counters have
// none.
func (sc *scratch) partitionKey(p *plan, partition uint64) []byte {
	perValue := p.override != nil
	for _, n := range sc.paths[p.pathOff : p.pathOff+p.pathLen] {
		if n.Value == "" || (n.Wildcard && !n.ShareThreshold) {
			perValue = true
		}
	}
	if !perValue {
		return nil
	}
	n := len(sc.pk)
	sc.pk = binary.BigEndian.AppendUint64(sc.pk, partition)
	return sc.pk[n:len(sc.pk):len(sc.pk)]
}
