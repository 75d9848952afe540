package cardinality

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"

	"github.com/envoyrls/envoy-rls/internal/textsafe"
)

// MaxValueBytes is the longest label value Shorten leaves alone by default:
// a request value longer than this is stored, and exported, as its first
// bytes and a hash. With a Cap of n values per metric, what one metric's
// request-derived labels hold is then at most n × MaxValueBytes.
const MaxValueBytes = 128

// hashLen is the length of the hash Shorten appends: '~' and 16 hex digits
// (64 bits of SHA-256).
const hashLen = 1 + 16

// Shorten returns v when it is at most n bytes long, else a string of at most
// n bytes: the longest prefix of v that fits (cut at a UTF-8 boundary), '~',
// and 16 hex digits of v's SHA-256. The same v always gives the same result,
// so a long value keeps its own series, and distinct long values with a
// common prefix stay distinct. n below 2 × hashLen is raised to it.
func Shorten(v string, n int) string {
	n = max(n, 2*hashLen)
	if len(v) <= n {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	cut := n - hashLen
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	b := make([]byte, 0, cut+hashLen)
	b = append(b, v[:cut]...)
	b = append(b, '~')
	b = hex.AppendEncode(b, sum[:8])
	return string(b)
}

// Label returns v as a Prometheus label value of at most n bytes (n below
// 2 × hashLen is raised to it): Shorten(v, n) when v is valid UTF-8. A
// value that is not (a request value can hold any bytes; Prometheus
// refuses, and WithLabelValues panics on, such a label) is written with
// textsafe.Escape, cut to fit, and always followed by '~' and 16 hex digits
// of the SHA-256 of its bytes: distinct values keep distinct series, and
// none of them reads as a valid value that looks the same once escaped.
func Label(v string, n int) string {
	if utf8.ValidString(v) {
		return Shorten(v, n)
	}
	n = max(n, 2*hashLen)
	esc := textsafe.Escape(v)
	sum := sha256.Sum256([]byte(v))
	cut := min(len(esc), n-hashLen)
	for cut > 0 && cut < len(esc) && !utf8.RuneStart(esc[cut]) {
		cut--
	}
	b := make([]byte, 0, cut+hashLen)
	b = append(b, esc[:cut]...)
	b = append(b, '~')
	b = hex.AppendEncode(b, sum[:8])
	return string(b)
}
