// Package rlheaders builds the HTTP fields that tell a client its rate limit
// quota: the IETF httpapi "RateLimit" and "RateLimit-Policy" fields
// (draft-ietf-httpapi-ratelimit-headers-09 and later, Structured Field Values
// per RFC 9651), the older X-RateLimit-* fields that Envoy builds for
// DRAFT_VERSION_03, the pre-IETF RateLimit-Limit/-Remaining/-Reset trio, and
// Retry-After.
//
// Every function is pure: the fields depend only on the policies given, so
// they can be tested against a Structured Field parser and reused by any Go
// program that decides limits.
package rlheaders

import (
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// Field names.
const (
	RateLimit        = "RateLimit"
	RateLimitPolicy  = "RateLimit-Policy"
	XRateLimitLimit  = "X-RateLimit-Limit"
	XRateLimitRemain = "X-RateLimit-Remaining"
	XRateLimitReset  = "X-RateLimit-Reset"
	LegacyLimit      = "RateLimit-Limit"
	LegacyRemaining  = "RateLimit-Remaining"
	LegacyReset      = "RateLimit-Reset"
	RetryAfterField  = "Retry-After"
	maxSFInteger     = 999_999_999_999_999 // RFC 9651 section 3.3.1
)

// LegacyNames are the names of the three legacy fields, which the reference
// server lets an operator choose (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
// LIMIT_RESET_HEADER). An empty name stands for the default one.
type LegacyNames struct {
	Limit, Remaining, Reset string
}

// DefaultLegacyNames are RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset.
var DefaultLegacyNames = LegacyNames{LegacyLimit, LegacyRemaining, LegacyReset}

// OrDefault returns n with every empty name replaced by the default one.
func (n LegacyNames) OrDefault() LegacyNames {
	if n.Limit == "" {
		n.Limit = LegacyLimit
	}
	if n.Remaining == "" {
		n.Remaining = LegacyRemaining
	}
	if n.Reset == "" {
		n.Reset = LegacyReset
	}
	return n
}

// ValidFieldName reports whether s is an HTTP field name: a non-empty token
// of RFC 9110 section 5.1.
func ValidFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Policy is one limit that applied to a request, with its state after the
// decision.
type Policy struct {
	// Name identifies the policy: the rule's name, or its descriptor path.
	// Bytes outside printable ASCII are written as '?' (a Structured Field
	// String holds nothing else).
	Name string
	// Quota is the number of hits allowed per Window (for a token bucket or
	// GCRA limit: the refill rate per Window).
	Quota uint64
	// Window is the limit's window; fields carry it in whole seconds, rounded
	// up, at least 1.
	Window time.Duration
	// PartitionKey, when not nil, says which partition of the policy the
	// request counted against (the "pk" parameter, a Byte Sequence).
	PartitionKey []byte
	// Remaining is how many more hits the limit allows now.
	Remaining uint64
	// Reset is how long until the quota is back for an allowed request, or
	// until the same request could pass for a denied one. Fields carry it in
	// whole seconds, rounded up.
	Reset time.Duration
	// Denied reports that this limit denied the request (and is enforced).
	Denied bool
}

// Binding returns the index of the most restrictive policy (see Binds), or
// -1 when there is none. Ties keep the earlier policy.
func Binding(ps []Policy) int {
	best := -1
	for i := range ps {
		if best < 0 || Binds(&ps[i], &ps[best]) {
			best = i
		}
	}
	return best
}

// Binds reports whether policy a binds harder than b: a denying policy over
// an allowing one, among denials the longer wait (Reset), among allowances
// the less remaining, then the longer reset.
func Binds(a, b *Policy) bool {
	if a.Denied != b.Denied {
		return a.Denied
	}
	if a.Denied {
		return a.Reset > b.Reset
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.Reset > b.Reset
}

// Seconds returns d in whole seconds, rounded up, clamped to what a
// Structured Field Integer holds; negative durations are 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(s, maxSFInteger)
}

// windowSeconds is a policy's window in whole seconds, at least 1.
func windowSeconds(d time.Duration) int64 {
	return max(Seconds(d), 1)
}

func integer(v uint64) uint64 { return min(v, maxSFInteger) }

// IETF returns the values of the RateLimit-Policy field (every policy, in
// order) and of the RateLimit field (the binding policy), or two empty
// strings when ps is empty.
//
//	RateLimit-Policy: "per-user";q=100;w=60, "burst";q=5;w=1;pk=:MTAuMC4wLjE=:
//	RateLimit: "burst";r=0;t=1;pk=:MTAuMC4wLjE=:
func IETF(ps []Policy) (policy, ratelimit string) {
	b := Binding(ps)
	if b < 0 {
		return "", ""
	}
	buf := AppendPolicy(make([]byte, 0, 48*len(ps)), ps)
	policy = string(buf)
	return policy, string(AppendRateLimit(buf[:0], &ps[b]))
}

// AppendPolicy appends the value of the RateLimit-Policy field of ps (every
// policy, in order) to dst.
func AppendPolicy(dst []byte, ps []Policy) []byte {
	for i := range ps {
		p := &ps[i]
		if i > 0 {
			dst = append(dst, ", "...)
		}
		dst = appendString(dst, p.Name)
		dst = append(dst, ";q="...)
		dst = strconv.AppendUint(dst, integer(p.Quota), 10)
		dst = append(dst, ";w="...)
		dst = strconv.AppendInt(dst, windowSeconds(p.Window), 10)
		dst = appendPartitionKey(dst, p.PartitionKey)
	}
	return dst
}

// AppendRateLimit appends the value of the RateLimit field for p, the
// binding policy, to dst.
func AppendRateLimit(dst []byte, p *Policy) []byte {
	dst = appendString(dst, p.Name)
	dst = append(dst, ";r="...)
	dst = strconv.AppendUint(dst, integer(p.Remaining), 10)
	dst = append(dst, ";t="...)
	dst = strconv.AppendInt(dst, Seconds(p.Reset), 10)
	return appendPartitionKey(dst, p.PartitionKey)
}

// Draft03 returns the values of X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset as Envoy's DRAFT_VERSION_03 builds them, or three empty
// strings when ps is empty. The limit field starts with the quota of the
// binding policy (see Binding; Envoy takes the least remaining, which is the
// same unless a limit denies with hits to spare), then lists every policy as
// "quota;w=seconds" with ;name="..." when it has a name, for example
// `10, 10;w=1, 1000;w=3600;name="daily"`. Unlike Envoy's builder, which sees
// one status per descriptor and its unit without the multiplier, every limit
// of a composite is listed, and a window such as 90s is w=90. Remaining and
// reset are the binding policy's, the reset in whole seconds, rounded up.
func Draft03(ps []Policy) (limit, remaining, reset string) {
	b := Binding(ps)
	if b < 0 {
		return "", "", ""
	}
	limit = string(AppendDraft03Limit(make([]byte, 0, 24*len(ps)+8), ps, b))
	return limit, strconv.FormatUint(ps[b].Remaining, 10), strconv.FormatInt(Seconds(ps[b].Reset), 10)
}

// AppendDraft03Limit appends the value of X-RateLimit-Limit (see Draft03)
// to dst, for the policies ps of which ps[binding] binds.
func AppendDraft03Limit(dst []byte, ps []Policy, binding int) []byte {
	dst = strconv.AppendUint(dst, ps[binding].Quota, 10)
	for i := range ps {
		p := &ps[i]
		dst = append(dst, ", "...)
		dst = strconv.AppendUint(dst, p.Quota, 10)
		dst = append(dst, ";w="...)
		dst = strconv.AppendInt(dst, windowSeconds(p.Window), 10)
		if p.Name != "" {
			dst = append(dst, ";name="...)
			dst = appendString(dst, p.Name)
		}
	}
	return dst
}

// Legacy returns the RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
// values for the binding policy, or three empty strings when ps is empty.
//
// Deprecated: nothing uses it. The reference server's fields
// (LIMIT_RESPONSE_HEADERS_ENABLED) describe the binding descriptor status
// and its requests per unit, which a Policy does not hold: pkg/rls builds
// them from its statuses.
func Legacy(ps []Policy) (limit, remaining, reset string) {
	b := Binding(ps)
	if b < 0 {
		return "", "", ""
	}
	p := &ps[b]
	return strconv.FormatUint(p.Quota, 10), strconv.FormatUint(p.Remaining, 10), strconv.FormatInt(Seconds(p.Reset), 10)
}

// RetryAfter returns the Retry-After value for a wait of d: whole seconds,
// rounded up, at least 1 (a denied client should not retry at once).
func RetryAfter(d time.Duration) string {
	return strconv.FormatInt(RetryAfterSeconds(d), 10)
}

// AppendRetryAfter appends the Retry-After value for a wait of d (see
// RetryAfter) to dst.
func AppendRetryAfter(dst []byte, d time.Duration) []byte {
	return strconv.AppendInt(dst, RetryAfterSeconds(d), 10)
}

// RetryAfterSeconds is the wait of d as Retry-After says it: whole seconds,
// rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) int64 { return max(Seconds(d), 1) }

// appendString appends s as a Structured Field String: quoted, with '"' and
// '\' escaped and every byte outside printable ASCII written as '?'.
func appendString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20 || c > 0x7e:
			buf = append(buf, '?')
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}

func appendPartitionKey(buf, pk []byte) []byte {
	if pk == nil {
		return buf
	}
	buf = append(buf, ";pk=:"...)
	buf = base64.StdEncoding.AppendEncode(buf, pk)
	return append(buf, ':')
}
