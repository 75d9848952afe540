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

// Binding returns the index of the most restrictive policy, or -1 when there
// is none: a denying policy over an allowing one, among denials the longest
// wait, among allowances the least remaining, then the longest reset. Ties
// keep the earlier policy.
func Binding(ps []Policy) int {
	best := -1
	for i := range ps {
		if best < 0 || moreRestrictive(&ps[i], &ps[best]) {
			best = i
		}
	}
	return best
}

func moreRestrictive(a, b *Policy) bool {
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
	buf := make([]byte, 0, 48*len(ps))
	for i := range ps {
		p := &ps[i]
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = appendString(buf, p.Name)
		buf = append(buf, ";q="...)
		buf = strconv.AppendUint(buf, integer(p.Quota), 10)
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, windowSeconds(p.Window), 10)
		buf = appendPartitionKey(buf, p.PartitionKey)
	}
	policy = string(buf)

	p := &ps[b]
	buf = appendString(buf[:0], p.Name)
	buf = append(buf, ";r="...)
	buf = strconv.AppendUint(buf, integer(p.Remaining), 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, Seconds(p.Reset), 10)
	buf = appendPartitionKey(buf, p.PartitionKey)
	return policy, string(buf)
}

// Draft03 returns the values of X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset as Envoy's DRAFT_VERSION_03 builds them, or three empty
// strings when ps is empty. The limit field starts with the quota of the
// binding policy (see Binding; Envoy takes the least remaining, which is the
// same unless a limit denies with hits to spare), then lists every policy as
// "quota;w=seconds" with ;name="..." when it has a name, for example
// `10, 10;w=1, 1000;w=3600;name="daily"`. Unlike Envoy's builder, which sees
// one status per descriptor and its unit without the multiplier, every limit
// of a composite is listed, and a window such as 90s is w=90.
func Draft03(ps []Policy) (limit, remaining, reset string) {
	if len(ps) == 0 {
		return "", "", ""
	}
	least := Binding(ps)
	buf := make([]byte, 0, 24*len(ps)+8)
	buf = strconv.AppendUint(buf, ps[least].Quota, 10)
	for i := range ps {
		p := &ps[i]
		buf = append(buf, ", "...)
		buf = strconv.AppendUint(buf, p.Quota, 10)
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, windowSeconds(p.Window), 10)
		if p.Name != "" {
			buf = append(buf, ";name="...)
			buf = appendString(buf, p.Name)
		}
	}
	return string(buf), strconv.FormatUint(ps[least].Remaining, 10), strconv.FormatInt(Seconds(ps[least].Reset), 10)
}

// Legacy returns the RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
// values (the reference server's LIMIT_RESPONSE_HEADERS_ENABLED) for the
// binding policy, or three empty strings when ps is empty.
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
	return strconv.FormatInt(max(Seconds(d), 1), 10)
}

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
