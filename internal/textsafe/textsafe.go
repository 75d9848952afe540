// Package textsafe makes request bytes safe for places that need text.
//
// A descriptor's domain, keys and values are bytes: they may hold anything
// a header held, including bytes that are not UTF-8 (see
// internal/grpccodec). Prometheus refuses such label values (WithLabelValues
// panics), protobuf-go refuses to marshal such strings (a structpb value in
// dynamic metadata, an OTLP span attribute), and JSON cannot carry them.
// Escape writes them in a form every one of those takes.
package textsafe

import (
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// Escape returns s unchanged when it is valid UTF-8. Otherwise it returns s
// with each byte that is not part of a valid UTF-8 sequence written as the
// four characters \xNN (lower-case hex); every valid character is kept as
// it is. The result is valid UTF-8.
func Escape(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+3*4)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 {
			b = append(b, '\\', 'x', hexDigits[s[i]>>4], hexDigits[s[i]&0xf])
			i++
			continue
		}
		b = append(b, s[i:i+size]...)
		i += size
	}
	return string(b)
}
